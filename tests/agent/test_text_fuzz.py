"""agentd.text.printable over anything a user can write: the result always fits a proto string and holds
nothing a terminal acts on, and plain text passes unchanged."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from agentd.proto import tuiprof_agent_pb2 as pb
from agentd.text import printable

ACTS_ON_TERMINAL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


@given(st.binary(max_size=256))
def test_any_bytes_become_a_safe_proto_string(raw):
    text = printable(raw)
    pb.GpuProcess(name=text, command=text).SerializeToString()
    assert not ACTS_ON_TERMINAL.search(text)


@given(st.text(alphabet=st.characters(codec=None), max_size=256))  # lone surrogates included (surrogateescape)
def test_any_str_becomes_a_safe_proto_string(raw):
    text = printable(raw)
    pb.InflightOp(op=text).SerializeToString()
    assert not ACTS_ON_TERMINAL.search(text)
    kept = printable(raw, keep_lines=True)
    assert not ACTS_ON_TERMINAL.search(kept.replace("\n", "").replace("\t", ""))


@given(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=128))
def test_printable_ascii_passes_unchanged(raw):
    assert printable(raw) == raw


def test_escapes_read_as_what_they_were():
    assert printable("op\x1b]52;c;aGk=\x07") == "op\\x1b]52;c;aGk=\\x07"
    assert printable("a\u202eb") == "a\\u202eb"
    assert printable("x\udcffy") == "x\ufffdy"  # the byte 0xff as os.fsdecode gives it
    assert printable("Traceback:\n\tline\x1b[K", keep_lines=True) == "Traceback:\n\tline\\x1b[K"
