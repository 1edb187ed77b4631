"""Emulated network links: profiles, namespace pairs, emulators (netem or userspace), verification."""
