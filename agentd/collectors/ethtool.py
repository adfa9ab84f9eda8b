"""A NIC driver's own statistics through the SIOCETHTOOL ioctl: what ``ethtool -S`` prints.

Three requests, as ethtool makes them: ETHTOOL_GSSET_INFO (how many statistics the
driver has), ETHTOOL_GSTRINGS (their names, 32 bytes each) and ETHTOOL_GSTATS (their
values, u64 each). Names are kept per NIC and asked again only when the count
changes (a driver reconfigured, e.g. more queues). No privilege is needed.

Every sample asks the count (the values buffer must be sized for it) and, only when
the driver has a statistic the caller wants (``only``), the values, into a buffer
kept per NIC; only the wanted ones are unpacked.

The kernel writes as many values as the driver has *now*, whatever size the caller
allowed for, so every buffer has room beyond the announced count and an answer of a
different size is not used.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import fcntl
import socket
import struct
from collections.abc import Collection

from agentd.collectors.readings import Unavailable

SIOCETHTOOL = 0x8946
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_GSTATS = 0x1D
ETHTOOL_GSSET_INFO = 0x37
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32
_IFNAMSIZ = 16
_IFREQ = struct.Struct(f"{_IFNAMSIZ}sP")  # ifr_name, then ifr_data (a pointer) in the union
_IFREQ_SIZE = 40  # sizeof(struct ifreq) on 64-bit Linux
_SSET_INFO = struct.Struct("=IIQI")  # cmd, reserved, sset_mask, data[0]
_GSTRINGS_HEAD = struct.Struct("=III")  # cmd, string_set, len
_GSTATS_HEAD = struct.Struct("=II")  # cmd, n_stats (u64 values follow at offset 8)
_U64 = struct.Struct("=Q")
# Room beyond the announced count, for a driver that grows between two requests.
_SLACK = 256
_CHANGED = Unavailable("the driver's statistics changed while being read; read again next sample")
# The answers of a driver without statistics: they last as long as the NIC does.
NO_STATISTICS = Unavailable("the driver reports no ethtool statistics")
NOT_SUPPORTED = Unavailable("the driver has no ethtool statistics")


@dataclasses.dataclass
class _Nic:
    """What is kept of one NIC between samples: its statistics' names and a values buffer sized for them."""

    names: list[str]
    values: ctypes.Array[ctypes.c_char]
    chosen: dict[frozenset[str] | None, list[int]] = dataclasses.field(default_factory=dict)  # only -> indexes

    def indexes(self, only: frozenset[str] | None) -> list[int]:
        """Where the names in ``only`` (every name for None) are, in the driver's order."""
        found = self.chosen.get(only)
        if found is None:
            found = self.chosen[only] = [i for i, name in enumerate(self.names) if only is None or name in only]
        return found


class EthtoolStats:
    """Reads NICs' driver statistics; one socket, names and buffers kept per NIC."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._nics: dict[str, _Nic] = {}
        self._count_buffer = ctypes.create_string_buffer(_SSET_INFO.size)

    def read(self, nic: str, only: Collection[str] | None = None) -> dict[str, int] | Unavailable:
        """The statistics of ``nic`` by the driver's name (those named in ``only``, when given), or why
        there are none; with ``only``, a driver that has none of them answers {} without reading values."""
        wanted = None if only is None else frozenset(only)
        try:
            count = self._count(nic)
            if count == 0:
                self._nics.pop(nic, None)
                return NO_STATISTICS
            kept = self._nics.get(nic)
            if kept is None or len(kept.names) != count:
                names = self._strings(nic, count)
                kept = self._nics[nic] = _Nic(names, ctypes.create_string_buffer(_GSTATS_HEAD.size + (count + _SLACK) * 8))
            if len(kept.names) != count:
                del self._nics[nic]
                return _CHANGED
            indexes = kept.indexes(wanted)
            if not indexes:
                return {}
            values = self._values(nic, count, kept.values, indexes)
        except OSError as exc:
            self._nics.pop(nic, None)
            if exc.errno == errno.EOPNOTSUPP:
                return NOT_SUPPORTED
            return Unavailable(f"ethtool statistics cannot be read ({exc.strerror})")
        if values is None:
            del self._nics[nic]
            return _CHANGED
        return {kept.names[index]: value for index, value in zip(indexes, values, strict=True)}

    def close(self) -> None:
        self._socket.close()

    def _request(self, nic: str, buffer: ctypes.Array[ctypes.c_char]) -> None:
        ifreq = _IFREQ.pack(nic.encode()[:_IFNAMSIZ - 1], ctypes.addressof(buffer)).ljust(_IFREQ_SIZE, b"\0")
        fcntl.ioctl(self._socket.fileno(), SIOCETHTOOL, ifreq)

    def _count(self, nic: str) -> int:
        buffer = self._count_buffer
        _SSET_INFO.pack_into(buffer, 0, ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_STATS, 0)
        self._request(nic, buffer)
        _, _, mask, count = _SSET_INFO.unpack_from(buffer)
        return count if mask & (1 << ETH_SS_STATS) else 0

    def _strings(self, nic: str, count: int) -> list[str]:
        buffer = ctypes.create_string_buffer(_GSTRINGS_HEAD.size + (count + _SLACK) * ETH_GSTRING_LEN)
        struct.pack_into(_GSTRINGS_HEAD.format, buffer, 0, ETHTOOL_GSTRINGS, ETH_SS_STATS, count)
        self._request(nic, buffer)
        written = _GSTRINGS_HEAD.unpack_from(buffer)[2]
        raw = buffer.raw[_GSTRINGS_HEAD.size:]
        return [raw[i * ETH_GSTRING_LEN:(i + 1) * ETH_GSTRING_LEN].split(b"\0", 1)[0].decode(errors="replace")
                for i in range(min(written, count + _SLACK))]

    def _values(self, nic: str, count: int, buffer: ctypes.Array[ctypes.c_char], indexes: list[int]) -> list[int] | None:
        """The values at ``indexes``, or None when the driver answered with another count than ``count``."""
        _GSTATS_HEAD.pack_into(buffer, 0, ETHTOOL_GSTATS, count)
        self._request(nic, buffer)
        written = _GSTATS_HEAD.unpack_from(buffer)[1]
        if written != count:
            return None
        if len(indexes) == count:
            return list(struct.unpack_from(f"={count}Q", buffer, _GSTATS_HEAD.size))
        return [_U64.unpack_from(buffer, _GSTATS_HEAD.size + 8 * index)[0] for index in indexes]
