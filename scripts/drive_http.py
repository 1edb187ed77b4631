"""The lab's Python load driver for HTTP/1.1, HTTP/2 and HTTP/3 (docs/http3.md); `--help` for options."""

import sys

from labrunner.run.drive.main import main

if __name__ == "__main__":
    sys.exit(main())
