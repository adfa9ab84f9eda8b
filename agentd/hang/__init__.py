"""Hang detection and stack dumps of the local ranks (issue 6)."""
