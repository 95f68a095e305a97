"""The client conformance scenario, in Python (run by scripts/conformance.py)."""
