"""The command lines: run_matrix.py (run_matrix, listing, session) and report.py (report)."""
