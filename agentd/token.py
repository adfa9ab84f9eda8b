"""The shared token: where it comes from and which token files are refused.

One rule for the agent (which checks callers against it) and every client
(which sends it), so a file one side accepts the other side accepts too.
"""

from __future__ import annotations

import os
import pathlib
import stat

TOKEN_ENV = "TUIPROF_TOKEN"


class TokenFileError(Exception):
    """A token file that cannot be used (missing, unreadable, or world-readable)."""


def read_token(token_file: str | os.PathLike[str] | None) -> str | None:
    """The shared token from ``token_file`` or ``$TUIPROF_TOKEN``; None when neither is set.

    A token file readable by other users is refused: anyone who can read it can
    control the agents.
    """
    if token_file is None:
        return os.environ.get(TOKEN_ENV) or None
    path = pathlib.Path(token_file)
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as exc:
        raise TokenFileError(f"cannot read token file {path}: {exc.strerror}") from exc
    if mode & stat.S_IROTH:
        raise TokenFileError(
            f"token file {path} is readable by every user (mode {stat.filemode(mode)}); "
            f"run `chmod 600 {path}`"
        )
    if not text:
        raise TokenFileError(f"token file {path} is empty")
    return text
