"""Bare "floor" servers, one per server stack: the lab's contract and per-request work, nothing else.

Run as `python -m benchmarks.floor.<name>` (matrix.toml's floor-* targets, preset floor): a lab
server's req/s and CPU per request against its floor's are the harness it carries.
"""
