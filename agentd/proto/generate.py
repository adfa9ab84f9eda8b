"""Regenerate the checked-in gRPC stubs from tuiprof_agent.proto.

Run ``python -m agentd.proto.generate`` after editing the .proto (needs the
``test`` extra for grpcio-tools). ``tests/agent/test_proto_stubs.py`` fails
when the checked-in stubs differ from what this produces.
"""

from __future__ import annotations

import pathlib
import sys
import tempfile

PROTO = pathlib.Path(__file__).with_name("tuiprof_agent.proto")
ROOT = PROTO.parents[2]
STUBS = ("tuiprof_agent_pb2.py", "tuiprof_agent_pb2.pyi", "tuiprof_agent_pb2_grpc.py")


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Write the stubs for the proto under ``out_dir`` (mirroring agentd/proto/)."""
    import grpc_tools  # imported here: only developers need grpcio-tools
    from grpc_tools import protoc

    relative = PROTO.relative_to(ROOT)
    well_known = pathlib.Path(grpc_tools.__file__).with_name("_proto")  # google/protobuf/descriptor.proto
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(relative),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")
    return [out_dir / relative.parent / name for name in STUBS]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for generated in generate(pathlib.Path(tmp)):
            (PROTO.parent / generated.name).write_bytes(generated.read_bytes())
            print(f"wrote {PROTO.parent / generated.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
