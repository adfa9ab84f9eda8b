"""Slow jobs: which rank the others wait for and what it costs (pure code the agent and the console share)."""
