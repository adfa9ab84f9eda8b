"""Who owns the other end of a local TCP connection, asked of the kernel.

The agent runs as root and local users reach it over loopback TCP, where no
SO_PEERCRED exists. The kernel still knows which uid created every TCP socket;
``ss -tnpe`` reads it through NETLINK_SOCK_DIAG (inet_diag). This module asks
the same question in pure Python: a dump request for TCP sockets whose ports
match (filtered in the kernel by inet_diag bytecode), whose addresses are then
matched here.

API (used by the agent's per-call policy, the dynolog RPC and ``tuiprof run``):

- ``tcp_socket_uid(local, remote)`` — the uid owning the TCP socket whose local
  address is ``local`` and, when ``remote`` is given, whose remote address is
  ``remote``; ``remote=None`` finds the LISTEN socket that accepts connections
  to ``local`` (a socket bound to a wildcard address counts, the most specific
  one wins, as in the kernel). Addresses are ``(host, port)`` with a literal
  IPv4 or IPv6 host; a remote host that is a wildcard (``0.0.0.0``, ``::``)
  matches any address. None when no such socket exists or when two sockets of
  different owners match (the answer would be a guess).
- ``tcp_listener(local)`` — who holds the listening socket that accepts
  connections to ``local``: a ``Listener`` (uid and the pids that have the
  socket open, as far as /proc lets the caller see), None when none listens.
  For messages naming who holds a port, and for clients deciding whether a
  loopback listener may be sent a token.
- ``grpc_peer_address(peer)`` — ``("127.0.0.1", 54321)`` from gRPC's
  ``context.peer()`` text (``ipv4:127.0.0.1:54321``, ``ipv6:[::1]:54321``);
  None for other transports.
- ``grpc_peer_uid(peer, server_port)`` — the uid of a gRPC caller connected to
  this host's ``server_port``, or None (remote caller, unknown socket).
- ``PeerLookupError`` — netlink itself failed (no NETLINK_SOCK_DIAG in this
  kernel, a malformed answer); its message says why.

Every lookup is one netlink round trip of a few hundred microseconds on a
quiet host; nothing is cached, because a port is reused by another user as
soon as its connection closes.
"""

from __future__ import annotations

import dataclasses
import errno
import ipaddress
import os
import pathlib
import socket
import struct

from agentd.text import user_label

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
INET_DIAG_REQ_BYTECODE = 1

# inet_diag bytecode operations (linux/inet_diag.h) and TCP states (net/tcp_states.h).
_BC_S_GE, _BC_S_LE, _BC_D_GE, _BC_D_LE = 2, 3, 4, 5
_TCP_LISTEN = 10
_CONNECTED_STATES = 1 << 1  # ESTABLISHED: a caller whose connection the server accepted
_LISTEN_STATES = 1 << _TCP_LISTEN

_NLMSGHDR = struct.Struct("=IHHII")
# inet_diag_req_v2: family, protocol, ext, pad, states, then inet_diag_sockid.
_REQ_V2 = struct.Struct("=BBBBI")
# inet_diag_sockid: sport, dport (big endian), src[16], dst[16], if, cookie[2].
_SOCKID = struct.Struct("!HH16s16s")
_SOCKID_TAIL = struct.Struct("=III")
# inet_diag_msg: family, state, timer, retrans, sockid (48 bytes), expires, rqueue, wqueue, uid, inode.
_DIAG_MSG_HEAD = struct.Struct("=BBBB")
_DIAG_MSG_TAIL = struct.Struct("=IIIII")
_SOCKID_SIZE = _SOCKID.size + _SOCKID_TAIL.size
_DIAG_MSG_SIZE = _DIAG_MSG_HEAD.size + _SOCKID_SIZE + _DIAG_MSG_TAIL.size
_NOCOOKIE = 0xFFFFFFFF
_TIMEOUT_SECONDS = 1.0

Address = tuple[str, int]


class PeerLookupError(Exception):
    """The kernel could not be asked (no sock_diag support, a malformed answer)."""


@dataclasses.dataclass(frozen=True)
class _Socket:
    """One TCP socket as inet_diag reports it (addresses as IP address objects)."""

    state: int
    local: tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]
    remote: tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]
    uid: int
    inode: int


@dataclasses.dataclass(frozen=True)
class Listener:
    """The owner of a listening socket: its uid, and the pids that hold it (empty when
    /proc does not show them to this caller, i.e. another user's processes to a non-root one)."""

    uid: int
    pids: tuple[int, ...]

    def __str__(self) -> str:
        user = user_label(self.uid)
        if not self.pids:
            return f"{user}, pid not visible to you"
        return f"{user}, pid {', '.join(str(pid) for pid in self.pids)}"


def tcp_socket_uid(local: Address, remote: Address | None) -> int | None:
    """The uid owning the TCP socket at ``local`` (connected to ``remote``, or listening)."""
    local_ip = ipaddress.ip_address(local[0])
    if remote is None:
        return _listener_uid(local_ip, local[1])
    remote_ip = ipaddress.ip_address(remote[0])
    found = {
        sock.uid
        for family in _families(local_ip)
        for sock in _dump(family, _CONNECTED_STATES, local[1], remote[1])
        if _same_ip(sock.local[0], local_ip)
        and (remote_ip.is_unspecified or _same_ip(sock.remote[0], remote_ip))
    }
    return found.pop() if len(found) == 1 else None


def grpc_peer_address(peer: str) -> Address | None:
    """``(host, port)`` from gRPC's peer text; None for unix sockets and unknown forms."""
    scheme, _, rest = peer.partition(":")
    if scheme not in ("ipv4", "ipv6"):
        return None
    host, _, port = rest.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    try:
        ipaddress.ip_address(host)
        return host, int(port)
    except ValueError:
        return None


def grpc_peer_uid(peer: str, server_port: int) -> int | None:
    """The uid of the caller behind ``context.peer()``, when it is a socket on this host.

    The caller's socket has the caller's address as its local end and this
    server's port as its remote end; it exists in this network namespace only
    when the caller runs on this host.
    """
    address = grpc_peer_address(peer)
    if address is None:
        return None
    wildcard = "::" if ":" in address[0] else "0.0.0.0"
    return tcp_socket_uid(address, (wildcard, server_port))


def tcp_listener(local: Address) -> Listener | None:
    """Who holds the socket listening for connections to ``local`` (None: none, or owners disagree)."""
    sockets = _listeners(ipaddress.ip_address(local[0]), local[1])
    uids = {sock.uid for sock in sockets}
    if len(uids) != 1:
        return None
    return Listener(uids.pop(), _pids_holding({sock.inode for sock in sockets}))


def _listener_uid(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> int | None:
    """The owner of the listener the kernel would hand a connection to ``ip``:``port``."""
    uids = {sock.uid for sock in _listeners(ip, port)}
    return uids.pop() if len(uids) == 1 else None


def _listeners(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> list[_Socket]:
    """The listening sockets the kernel would pick from for a connection to ``ip``:``port``."""
    listeners = [sock for family in (socket.AF_INET, socket.AF_INET6)
                 for sock in _dump(family, _LISTEN_STATES, port, 0)]
    exact = [s for s in listeners if _same_ip(s.local[0], ip)]
    if exact:
        return exact
    same_family = [s for s in listeners if s.local[0].is_unspecified and s.local[0].version == ip.version]
    if same_family:
        return same_family
    # An IPv6 wildcard listener also accepts IPv4 connections unless it is v6-only,
    # which inet_diag does not report; a v4 address reaching here has no v4 listener.
    return [s for s in listeners if s.local[0].is_unspecified]


def _pids_holding(inodes: set[int]) -> tuple[int, ...]:
    """The pids with one of the socket ``inodes`` open, among the processes whose fds /proc shows us."""
    names = {f"socket:[{inode}]" for inode in inodes}
    pids = []
    for process in pathlib.Path("/proc").iterdir():
        if not process.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in names for fd in (process / "fd").iterdir()):
                pids.append(int(process.name))
        except OSError:  # not ours to see, or gone
            continue
    return tuple(sorted(pids))


def _families(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> tuple[int, ...]:
    """Socket families an endpoint with address ``ip`` may have (v4 also as v4-mapped v6)."""
    if ip.version == 4 or (isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped):
        return socket.AF_INET, socket.AF_INET6
    return (socket.AF_INET6,)


def _same_ip(a: ipaddress.IPv4Address | ipaddress.IPv6Address,
             b: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return _plain(a) == _plain(b)


def _plain(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _port_filter(sport: int, dport: int) -> bytes:
    """inet_diag bytecode: sport == ``sport`` and (when non-zero) dport == ``dport``.

    Each test is two 4-byte ops (the second carries the port); a failed test
    jumps past the end of the program, which rejects the socket.
    """
    tests = [(_BC_S_GE, sport), (_BC_S_LE, sport)]
    if dport:
        tests += [(_BC_D_GE, dport), (_BC_D_LE, dport)]
    program = b""
    remaining = 8 * len(tests)
    for code, port in tests:
        program += struct.pack("=BBH", code, 8, remaining + 4) + struct.pack("=BBH", 0, 0, port)
        remaining -= 8
    return program


def _request(family: int, states: int, sport: int, dport: int) -> bytes:
    bytecode = _port_filter(sport, dport)
    attribute = struct.pack("=HH", 4 + len(bytecode), INET_DIAG_REQ_BYTECODE) + bytecode
    body = (_REQ_V2.pack(family, socket.IPPROTO_TCP, 0, 0, states)
            + _SOCKID.pack(0, 0, b"\0" * 16, b"\0" * 16)
            + _SOCKID_TAIL.pack(0, _NOCOOKIE, _NOCOOKIE)
            + attribute)
    header = _NLMSGHDR.pack(_NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY,
                            NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
    return header + body


def _dump(family: int, states: int, sport: int, dport: int) -> list[_Socket]:
    """TCP sockets of ``family`` in ``states`` with local port ``sport`` (and remote ``dport``)."""
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC,
                           NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(_TIMEOUT_SECONDS)
            nl.sendto(_request(family, states, sport, dport), (0, 0))
            return _read_dump(nl, family)
    except OSError as exc:
        raise PeerLookupError(
            f"cannot ask the kernel who owns TCP sockets (NETLINK_SOCK_DIAG): "
            f"{exc.strerror or exc}"
        ) from None


def _read_dump(nl: socket.socket, family: int) -> list[_Socket]:
    found: list[_Socket] = []
    while True:
        data = nl.recv(65536)
        offset = 0
        while offset + _NLMSGHDR.size <= len(data):
            length, kind, _, _, _ = _NLMSGHDR.unpack_from(data, offset)
            if length < _NLMSGHDR.size:
                raise PeerLookupError(f"malformed netlink answer (message length {length})")
            if kind == NLMSG_DONE:
                return found
            if kind == NLMSG_ERROR:
                (code,) = struct.unpack_from("=i", data, offset + _NLMSGHDR.size)
                if -code == errno.ENOENT:  # no socket of this family at all
                    return found
                raise PeerLookupError(f"inet_diag refused the request: {os.strerror(-code)}")
            if kind == SOCK_DIAG_BY_FAMILY:
                found.append(_parse(data, offset + _NLMSGHDR.size, family))
            offset += (length + 3) & ~3


def _parse(data: bytes, offset: int, family: int) -> _Socket:
    if len(data) < offset + _DIAG_MSG_SIZE:
        raise PeerLookupError("malformed inet_diag answer (message too short)")
    _, state, _, _ = _DIAG_MSG_HEAD.unpack_from(data, offset)
    sport, dport, src, dst = _SOCKID.unpack_from(data, offset + _DIAG_MSG_HEAD.size)
    _, _, _, uid, inode = _DIAG_MSG_TAIL.unpack_from(data, offset + _DIAG_MSG_HEAD.size + _SOCKID_SIZE)
    return _Socket(state, (_ip(family, src), sport), (_ip(family, dst), dport), uid, inode)


def _ip(family: int, raw: bytes) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.IPv4Address(raw[:4]) if family == socket.AF_INET else ipaddress.IPv6Address(raw)
