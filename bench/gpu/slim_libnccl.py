"""Make a real NCCL wheel's libnccl.so.2 small enough to travel to a one-GPU H200 machine.

A libnccl.so.2 from PyPI is 250–400 MB: device code for every GPU architecture from
Maxwell on, twice (`.nv_fatbin`, loaded at run time, and `__nv_relfatbin`, relocatable
code that only a device link reads). The device machine takes 64 MiB a call, so the
benches that run real NCCL releases (nccl_versions.py) carry each one slimmed:

- every `.nv_fatbin` entry that is not the chosen architecture's cubin is zeroed, its
  header kept, so the container parses as before and the driver still finds the sm_90
  cubin it would have picked anyway;
- `__nv_relfatbin` is zeroed whole (no device link happens at run time).

Zeroed bytes compress to nothing: `xz -9` of the result is 8–25 MB (Python's lzma unpacks it there).
The host code is untouched, so the library behaves as the release does on that GPU.
The script refuses a library whose `.nv_fatbin` holds no cubin for the architecture.

    python bench/gpu/slim_libnccl.py WHEEL_OR_SO OUT.so [--arch 90]      # here
    python bench/gpu/slim_libnccl.py --unpack FOLDER /tmp/nccl              # on the GPU machine

`--unpack` turns each FOLDER/libnccl-VERSION.so.xz into /tmp/nccl/VERSION/lib/libnccl.so.2 (an NCCL_HOME
for nccl-tests, with include/nccl.h from .carry/nccl-include/VERSION when it is there). The files can come
in several device calls, a few at a time: what is unpacked already stays on a warm machine.
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import struct
import sys
import zipfile
from collections import Counter
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
ENTRY_KIND = {1: "ptx", 2: "cubin"}


def sections(image: bytes) -> dict[str, tuple[int, int]]:
    """ELF64 section name -> (file offset, size)."""
    shoff, = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    found = {}
    for name_offset, _type, _flags, _addr, offset, size, *_ in headers:
        end = image.index(b"\0", names_at + name_offset)
        found[image[names_at + name_offset:end].decode()] = (offset, size)
    return found


def slim_fatbin(image: bytearray, start: int, size: int, arch: int) -> Counter[str]:
    """Zero every entry of the fatbin containers in image[start:start+size] but arch's cubin."""
    kept: Counter[str] = Counter()
    position = start
    while position + 16 <= start + size:
        magic, _version, header_size, body_size = struct.unpack_from("<IHHQ", image, position)
        if magic != FATBIN_MAGIC:  # containers are 8-byte aligned, padding between them
            position += 8
            continue
        entry = position + header_size
        end = entry + body_size
        while entry < end:
            kind, _unknown, entry_header, payload = struct.unpack_from("<HHIQ", image, entry)
            entry_arch, = struct.unpack_from("<I", image, entry + 28)
            label = f"{ENTRY_KIND.get(kind, kind)} sm_{entry_arch}"
            if kind == 2 and entry_arch == arch:
                kept[f"kept {label}"] += 1
            else:
                image[entry + entry_header:entry + entry_header + payload] = bytes(payload)
                kept[f"zeroed {label}"] += 1
            entry += entry_header + payload
        position = end
    return kept


def unpack(folder: Path, to: Path) -> None:
    for packed in sorted(folder.glob("libnccl-*.so.xz")):
        version = packed.name.removeprefix("libnccl-").removesuffix(".so.xz")
        lib = to / version / "lib"
        if (lib / "libnccl.so.2").exists():  # an earlier call's
            continue
        lib.mkdir(parents=True, exist_ok=True)
        with lzma.open(packed) as source, open(lib / "libnccl.so.2", "wb") as target:
            shutil.copyfileobj(source, target, 1 << 24)
        header = Path(".carry/nccl-include") / version / "nccl.h"
        if header.exists():
            (to / version / "include").mkdir(exist_ok=True)
            shutil.copy(header, to / version / "include" / "nccl.h")
        print("unpacked", version, "to", lib)


def main() -> int:
    if sys.argv[1:2] == ["--unpack"]:
        unpack(Path(sys.argv[2]), Path(sys.argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="an nvidia-nccl wheel or a libnccl.so.2")
    parser.add_argument("output", type=Path)
    parser.add_argument("--arch", type=int, default=90)
    options = parser.parse_args()
    if options.source.suffix == ".whl":
        with zipfile.ZipFile(options.source) as wheel:
            member = next(name for name in wheel.namelist() if name.endswith("/libnccl.so.2"))
            image = bytearray(wheel.read(member))
    else:
        image = bytearray(options.source.read_bytes())
    found = sections(bytes(image))
    offset, size = found[".nv_fatbin"]
    entries = slim_fatbin(image, offset, size, options.arch)
    if not entries[f"kept cubin sm_{options.arch}"]:
        print(f"{options.source}: no sm_{options.arch} cubin in .nv_fatbin ({dict(entries)}); not written",
              file=sys.stderr)
        return 1
    if "__nv_relfatbin" in found:
        offset, size = found["__nv_relfatbin"]
        image[offset:offset + size] = bytes(size)
    options.output.write_bytes(image)
    print(options.output, dict(sorted(entries.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
