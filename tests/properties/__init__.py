"""Property-based tests of the README's contract on bad input (see harness.py)."""
