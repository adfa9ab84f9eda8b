"""Text another user wrote, made safe to show anyone: valid UTF-8, and no character a terminal acts on.

Rank op names and job ids (from segments), `.inert` notes, Flight Recorder op names,
py-spy frames, GPU process names and command lines are written by whoever runs the
process; the agent shows them to every local user and the console prints them to
terminals. A control character there is a command to the terminal (an OSC 52 clipboard
write, a title change, a clear screen), so each one is written out as a visible escape
(``\\x1b``, ``\\u202e``) instead: the text stays readable and nothing acts on it. Bytes
that are not UTF-8 (or the surrogates Python decodes them to) become U+FFFD.

The agent applies ``printable`` where such text enters a snapshot, and the console
again where proto strings become its model and where it prints text (an older agent
may not have).
"""

from __future__ import annotations

import pwd
import re

# C0 controls, DEL and C1 controls; the bidirectional overrides and isolates that reorder what is shown
# (a "Trojan Source" name reads as something else); line and paragraph separators.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_UNSAFE_KEEPING_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_SURROGATES = re.compile("[\ud800-\udfff]")


def printable(text: str | bytes, keep_lines: bool = False) -> str:
    """``text`` with every control character written out as an escape and undecodable bytes as U+FFFD.

    ``keep_lines``: newlines and tabs stay (a traceback's layout); everything else is escaped."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    elif _SURROGATES.search(text):  # os/psutil decode undecodable bytes as lone surrogates (surrogateescape)
        try:
            text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        except UnicodeEncodeError:  # a surrogate that stands for no byte
            text = _SURROGATES.sub("\ufffd", text)
    unsafe = _UNSAFE_KEEPING_LINES if keep_lines else _UNSAFE
    if not unsafe.search(text):
        return text
    return unsafe.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def user_label(uid: int) -> str:
    """A uid as people read it: ``user alice (uid 1001)``, or ``uid 1001`` when it has no name here."""
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
