"""Benchmarks: each prints a table against a baseline measured in the same run. Not tests."""
