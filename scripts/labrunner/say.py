"""How the runner and the report talk to the user: one line at a time (print, or a test's list)."""

from collections.abc import Callable

Say = Callable[[str], None]
