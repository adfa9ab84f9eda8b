"""Helpers shared by the test suite (importable because pytest puts tests/ on sys.path; no folder under tests/ may be named like a package of ours, or it would shadow it)."""
