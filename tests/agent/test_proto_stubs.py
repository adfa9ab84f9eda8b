"""The checked-in gRPC stubs must be what the .proto generates today."""

from __future__ import annotations

import pathlib

from agentd.proto import generate


def test_checked_in_stubs_match_the_proto(tmp_path: pathlib.Path) -> None:
    stale = [
        path.name
        for path in generate.generate(tmp_path)
        if (generate.PROTO.parent / path.name).read_bytes() != path.read_bytes()
    ]
    assert not stale, f"stale stubs {stale}: run `python -m agentd.proto.generate` and commit"
