"""A packet capture for the exposure tests: what crosses a network interface while a request is
served, read with a raw AF_PACKET socket (root only; Python's own, no tcpdump), so a test can say
"no byte of the key crossed this hop" and prove the capture sees payloads at all.

What is real: the kernel's copies of every frame on the interface (the loopback of this machine, or
a podman network's bridge, which carries the traffic between its containers: the socket puts the
interface in promiscuous mode, without which a bridge keeps the frames it forwards from its taps).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

ETH_P_ALL = 0x0003
SOL_PACKET, PACKET_ADD_MEMBERSHIP, PACKET_MR_PROMISC = 263, 1, 1  # <linux/if_packet.h>


@dataclass(frozen=True)
class Segment:
    """One TCP or UDP payload seen on the interface."""

    src: str
    sport: int
    dst: str
    dport: int
    payload: bytes


@dataclass
class Capture:
    interface: str
    segments: list[Segment] = field(default_factory=list)
    frames: int = 0

    def between(self, address: str, port: int | None = None) -> list[Segment]:
        """The payloads sent to or from `address` (and `port`, when given)."""
        return [
            s
            for s in self.segments
            if (s.src == address and (port is None or s.sport == port))
            or (s.dst == address and (port is None or s.dport == port))
        ]

    @staticmethod
    def holds(segments: list[Segment], needle: bytes) -> bool:
        """Whether `needle` is in the bytes of `segments`, one segment or across two neighbours."""
        stream = b"".join(s.payload for s in segments)
        return needle in stream or any(needle in s.payload for s in segments)


def _parse(frame: bytes) -> Segment | None:
    """An Ethernet frame's IPv4 TCP/UDP payload (the loopback carries an Ethernet header of zeros)."""
    if len(frame) < 34 or frame[12:14] != b"\x08\x00":
        return None
    ip = frame[14:]
    header = (ip[0] & 0x0F) * 4
    total = struct.unpack("!H", ip[2:4])[0]
    protocol = ip[9]
    src, dst = str(ipaddress.IPv4Address(ip[12:16])), str(ipaddress.IPv4Address(ip[16:20]))
    body = ip[header:total]
    if protocol == 6 and len(body) >= 20:
        offset = (body[12] >> 4) * 4
        sport, dport = struct.unpack("!HH", body[:4])
        return Segment(src, sport, dst, dport, bytes(body[offset:]))
    if protocol == 17 and len(body) >= 8:
        sport, dport = struct.unpack("!HH", body[:4])
        return Segment(src, sport, dst, dport, bytes(body[8:]))
    return None


@contextlib.contextmanager
def capturing(interface: str) -> Iterator[Capture]:
    """Capture every IPv4 TCP/UDP payload on `interface` until the block ends (root only)."""
    capture = Capture(interface)
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((interface, 0))
    # promiscuous, as tcpdump makes it: a bridge hands its packet sockets the frames it forwards between
    # two of its ports (one container to another) only in this mode; dropped when the socket closes
    membership = struct.pack("iHH8s", socket.if_nametoindex(interface), PACKET_MR_PROMISC, 0, b"\0" * 8)
    sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, membership)
    sock.settimeout(0.1)
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                frame = sock.recv(262144)
            except TimeoutError:
                continue
            except OSError:
                return
            capture.frames += 1
            segment = _parse(frame)
            if segment is not None and segment.payload:
                capture.segments.append(segment)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        yield capture
    finally:
        stop.set()
        thread.join(5)
        sock.close()
