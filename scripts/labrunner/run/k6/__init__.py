"""k6 for a scenario: its invocation, running it, what it writes, and a split run merged."""
