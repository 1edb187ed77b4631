"""Orchestration package behind scripts/run_matrix.py and scripts/local_obs.py."""
