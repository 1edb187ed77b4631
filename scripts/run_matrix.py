"""Run the protolab scenario matrix (matrix.toml); `--help` documents every option."""

import sys

from labrunner.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
