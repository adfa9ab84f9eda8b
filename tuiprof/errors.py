"""Errors tuiprof reports to the person who ran it: one line, what was wrong and what to do.

Every error class of the console derives from ``TuiprofError``. ``tuiprof.cli.main``
catches it once, prints ``tuiprof <command>: <message>`` and exits with its
``exit_code`` (the exit statuses the README documents); bad input never ends in a
traceback. This module imports nothing of tuiprof, so every layer may raise these.
"""

from __future__ import annotations


class TuiprofError(Exception):
    """A problem the user can do something about; ``str()`` is the whole explanation."""

    exit_code = 1


class BadInputError(TuiprofError):
    """Input tuiprof cannot use: an option, a host, a file or a pattern (exit 2, "bad arguments")."""

    exit_code = 2
