"""Generate the lab CA and server certificate into certs/ (never committed); `--help` for options."""

import sys

from labrunner.certs import main

if __name__ == "__main__":
    sys.exit(main())
