"""Benchmarks: scripts that print measured numbers (run with python -m benchmarks.NAME)."""
