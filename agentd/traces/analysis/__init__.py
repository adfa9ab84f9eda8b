"""Trace analysis where the traces are: one rank's summary, made by the agent on its node and by the console on files on disk."""
