"""Residency policies: decision code shared by the reference runtime and the simulator.

Imports nothing of ours but :mod:`harness.errors`, so both run the same decisions."""
