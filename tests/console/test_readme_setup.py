"""The README's first command works as root (no sudo on a root-only Debian) and as a user."""

import pathlib
import subprocess

README = pathlib.Path(__file__).parents[2] / "README.md"


def _setup_command() -> str:
    section = README.read_text().split("## Set up", 1)[1]
    return next(line.strip() for line in section.splitlines() if line.startswith("    "))


def _sudo_prefix_as(uid: int) -> str:
    """What the command's SUDO part expands to for ``uid`` (id stubbed to answer it)."""
    choose = _setup_command().split(";", 1)[0]
    script = f'id() {{ echo {uid}; }}; {choose}; printf "[%s]" "$SUDO"'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout


def test_the_first_command_uses_sudo_only_when_not_root():
    command = _setup_command()
    assert not command.startswith("sudo ") and "$SUDO apt-get install" in command
    assert _sudo_prefix_as(0) == "[]"
    assert _sudo_prefix_as(1000) == "[sudo]"
