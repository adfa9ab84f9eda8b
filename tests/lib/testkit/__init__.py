"""Helpers shared by the test suite (importable because pytest puts tests/lib on sys.path; not tests/ itself, where tests/agentd would shadow the agentd package)."""
