"""Benchmarks: scripts that print a table and write JSON. Speed goals are judged here, never in tests."""
