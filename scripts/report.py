"""Regenerate a run's report (report.md, report.html, charts/) from its saved JSON; `--help` for options."""

import sys

from labrunner.cli.report import main

if __name__ == "__main__":
    sys.exit(main())
