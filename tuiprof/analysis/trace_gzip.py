"""One gzip file from deflate pieces compressed in parallel (the pigz trick, stdlib only).

Each piece is raw deflate ended with a sync flush, so pieces concatenate into
one valid deflate stream; the last piece is finished. The gzip trailer's CRC-32
of the whole is combined from the pieces' CRCs (zlib's crc32_combine, which
Python's zlib does not expose), so no process ever holds all the data.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import BinaryIO

GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, no mtime, unknown OS
_CRC_POLYNOMIAL = 0xEDB88320


@dataclass(frozen=True)
class Piece:
    deflated: bytes
    crc: int
    size: int


def compress_piece(data: bytes, level: int = 1, last: bool = False) -> Piece:
    compressor = zlib.compressobj(level, zlib.DEFLATED, -15)
    deflated = compressor.compress(data) + compressor.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH)
    return Piece(deflated, zlib.crc32(data), len(data))


def _gf2_times(matrix: list[int], vector: int) -> int:
    total, row = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[row]
        vector >>= 1
        row += 1
    return total


def _gf2_square(matrix: list[int]) -> list[int]:
    return [_gf2_times(matrix, matrix[n]) for n in range(32)]


def crc32_combine(crc1: int, crc2: int, size2: int) -> int:
    """CRC-32 of A+B from crc(A), crc(B) and len(B) (zlib's algorithm: apply len(B) zero bytes to crc(A))."""
    if size2 == 0:
        return crc1
    odd = [_CRC_POLYNOMIAL] + [1 << n for n in range(31)]  # operator for one zero bit
    even = _gf2_square(odd)  # two zero bits
    odd = _gf2_square(even)  # four zero bits
    while True:
        even = _gf2_square(odd)  # first pass: one zero byte
        if size2 & 1:
            crc1 = _gf2_times(even, crc1)
        size2 >>= 1
        if not size2:
            break
        odd = _gf2_square(even)
        if size2 & 1:
            crc1 = _gf2_times(odd, crc1)
        size2 >>= 1
        if not size2:
            break
    return crc1 ^ crc2


class GzipPieces:
    """Writes pieces in order to ``out`` as one gzip member; ``close`` adds the final piece and trailer."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._crc = 0
        self._size = 0
        out.write(GZIP_HEADER)

    def add(self, piece: Piece) -> None:
        self._out.write(piece.deflated)
        self._crc = crc32_combine(self._crc, piece.crc, piece.size)
        self._size += piece.size

    def close(self, tail: bytes) -> None:
        self.add(compress_piece(tail, last=True))
        self._out.write(struct.pack("<II", self._crc, self._size & 0xFFFFFFFF))
