"""The shared token: where it comes from and which token files are refused.

One rule for the agent (which checks callers against it) and every client
(which sends it), so a file one side accepts the other side accepts too.
"""

from __future__ import annotations

import os
import pathlib
import stat

from agentd.text import user_label

TOKEN_ENV = "TUIPROF_TOKEN"


class TokenFileError(Exception):
    """A token file that cannot be used (missing, unreadable, world-readable, or another user's)."""


def read_token(token_file: str | os.PathLike[str] | None) -> str | None:
    """The shared token from ``token_file`` or ``$TUIPROF_TOKEN``; None when neither is set.

    A token file readable by other users is refused: anyone who can read it can
    control the agents. So is one owned by another user than the reader or root:
    its owner can change the token the reader sends or checks (a root agent would
    then accept that user's token, a root command would send the admin's calls
    with it). The checks are made on the file opened, not on its name, so the
    file cannot be swapped between check and read.
    """
    if token_file is None:
        return os.environ.get(TOKEN_ENV) or None
    path = pathlib.Path(token_file)
    try:
        # Not blocking: a FIFO put in its place would hang the reader before any check.
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), encoding="utf-8",
                  errors="replace") as file:
            info = os.fstat(file.fileno())
            text = file.read().strip() if stat.S_ISREG(info.st_mode) else ""
    except OSError as exc:
        raise TokenFileError(f"cannot read token file {path}: {exc.strerror}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise TokenFileError(f"token file {path} is not a regular file; give the file holding the token")
    if info.st_uid not in (0, os.getuid()):
        raise TokenFileError(
            f"token file {path} belongs to {user_label(info.st_uid)}, not to you or root; "
            "use a token file you own (mode 600)"
        )
    if info.st_mode & stat.S_IROTH:
        raise TokenFileError(
            f"token file {path} is readable by every user (mode {stat.filemode(info.st_mode)}); "
            f"run `chmod 600 {path}`"
        )
    if not text:
        raise TokenFileError(f"token file {path} is empty")
    return text
