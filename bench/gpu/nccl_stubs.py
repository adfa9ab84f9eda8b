"""Let this PyTorch load an older NCCL: stubs for the NCCL functions it binds that the older one lacks.

PyTorch 2.11's libtorch_cuda binds every NCCL function it may call when it loads
(ncclCommWindowRegister, ncclCommShrink, ...). A libnccl.so.2 put first in LD_PRELOAD takes the
soname, so the NCCL PyTorch ships is never loaded and an older release leaves those symbols
undefined: `import torch` fails. Each missing function gets a stub returning ncclInvalidUsage (5);
a job that calls only what the older NCCL has (collectives, send/recv, communicator set-up) never
reaches one.

    python3 bench/gpu/nccl_stubs.py LIBNCCL OUT_FOLDER     # prints the stub library's path, or nothing

Needs nm and gcc (the GPU machine has both).
"""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys


def nccl_symbols(library: pathlib.Path, defined: bool) -> set[str]:
    which = "--defined-only" if defined else "--undefined-only"
    listing = subprocess.run(["nm", "-D", which, str(library)], check=True, capture_output=True, text=True).stdout
    return {fields[-1] for fields in map(str.split, listing.splitlines()) if fields and fields[-1].startswith("nccl")}


def build_stubs(libnccl: pathlib.Path, out: pathlib.Path) -> pathlib.Path | None:
    """The stub library for what torch binds and ``libnccl`` lacks (None when it lacks nothing)."""
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None, "no torch here"
    torch_cuda = pathlib.Path(spec.origin).parent / "lib" / "libtorch_cuda.so"
    missing = sorted(nccl_symbols(torch_cuda, defined=False) - nccl_symbols(libnccl, defined=True))
    if not missing:
        return None
    out.mkdir(parents=True, exist_ok=True)
    source = out / f"nccl_stubs_for_{libnccl.parent.parent.name}.c"
    source.write_text("".join(f"int {name}(void) {{ return 5; }}\n" for name in missing))
    library = source.with_suffix(".so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    print(f"stubbed for PyTorch on {libnccl}: {' '.join(missing)}", file=sys.stderr)
    return library


if __name__ == "__main__":
    stubs = build_stubs(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))
    print(stubs or "")
