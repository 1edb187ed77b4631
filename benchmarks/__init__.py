"""Benchmarks of the lab itself, outside services/: what users compare stays the lab's servers."""
