"""Helpers shared by the test suite (importable because pytest puts tests/ on sys.path)."""
