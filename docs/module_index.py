"""Writes the "Every module" section of docs/architecture.md from each module's own first line.

The map above that section is written by hand; this index cannot drift from the code, because
``tests/test_docs.py`` fails when it is stale. Run ``python docs/module_index.py`` after adding,
moving or re-describing a module.
"""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- module index: written by docs/module_index.py -->"
END = "<!-- end of module index -->"
PACKAGES = ("agentd", "tuiprof", "tuiprof_native")
LONG = 240  # characters


def _first_sentence(text: str) -> str:
    paragraph = " ".join(text.strip().split("\n\n")[0].split())
    end = re.search(r"\.(\s|$)", paragraph)
    sentence = paragraph[:end.start() + 1] if end else paragraph
    if len(sentence) > LONG and ":" in sentence:  # a sentence that goes on into a list: its head
        sentence = sentence.split(":")[0] + "."
    return sentence


def described(path: pathlib.Path) -> str:
    """The first sentence of the module's docstring (Python, Cython) or leading comment (C)."""
    text = path.read_text()
    if path.suffix == ".py":
        return _first_sentence(ast.get_docstring(ast.parse(text)) or "")
    if path.suffix == ".pyx":
        match = re.search(r'"""(.*?)"""', text, re.S)
    else:
        match = re.match(r"\s*/\*(.*?)\*/", text, re.S)
        if match:
            return _first_sentence("\n".join(line.strip().lstrip("*").strip() for line in match.group(1).splitlines()))
    return _first_sentence(match.group(1)) if match else ""


def modules() -> list[str]:
    tracked = subprocess.run(["git", "ls-files", *PACKAGES], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    return sorted(f for f in tracked
                  if (f.endswith(".py") and not f.endswith("__init__.py") and "_pb2" not in f)
                  or (f.endswith(".c") and "/hook/" in f) or f.endswith(".pyx"))


def index() -> str:
    rows = [BEGIN, "", "| module | what it is |", "|---|---|"]
    for name in modules():
        path = ROOT / name
        rows.append(f"| `{name}` | {described(path).replace('|', '&#124;')} |")
    return "\n".join([*rows, "", END])


def written(text: str) -> str:
    """``text`` (the architecture page) with its index section replaced by the current one."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + index() + text[end:]


if __name__ == "__main__":
    ARCHITECTURE.write_text(written(ARCHITECTURE.read_text()))
    sys.exit(0)
