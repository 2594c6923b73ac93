"""What `mosquitto_pub -f` and `mosquitto_sub -C 1` cost on their own for one large message.

bench/proxy.py compares 64 MiB `mosquitto_pub` -> `mosquitto_sub`, both through the proxy,
with `client.Client` end to end. The tools carry costs of their own that no proxy can take
away and the library's figure does not carry: `mosquitto_pub -f` reads the whole file and
builds the whole packet (two more copies into fresh memory) before it sends a byte, and
`mosquitto_sub` takes the last bytes of the packet off its socket, writes the payload out
and exits after the last byte arrives. This measures both against a minimal MQTT 5 endpoint
in this process that keeps nothing:

* publisher: from starting `mosquitto_pub` to the first byte of its PUBLISH (its CONNECT
  answered at once);
* subscriber: from the last byte of a PUBLISH of that size handed to the socket
  (`socket.sendfile`) to `mosquitto_sub`'s exit.

    python bench/tool_cost.py [--size-mib 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import _harness  # noqa: F401  (puts the repository on sys.path)

from proxy.protocol import encode_varint

MiB = 1 << 20
CONNACK_V5 = b"\x20\x03\x00\x00\x00"  # session present 0, success, no properties


def _exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        piece = sock.recv(min(n - len(data), MiB))
        if not piece:
            raise ConnectionError("peer closed mid-packet")
        data += piece
    return bytes(data)


def _remaining_length(sock: socket.socket) -> int:
    value, shift = 0, 0
    while True:
        byte = _exact(sock, 1)[0]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7


def _packet(sock: socket.socket) -> tuple[int, bytes]:
    first = _exact(sock, 1)[0]
    return first, _exact(sock, _remaining_length(sock))


def _listener() -> tuple[socket.socket, int]:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(60)
    return server, server.getsockname()[1]


def _tool(program: str, port: int, *extra: str) -> list[str]:
    return [program, "-h", "127.0.0.1", "-p", str(port), "-t", "t", "-q", "1", "-V", "5", *extra]


def publisher_cost(path: Path) -> float:
    """Seconds from starting `mosquitto_pub -f path` to its PUBLISH's first byte."""
    server, port = _listener()
    with server:
        start = time.perf_counter()
        proc = subprocess.Popen(_tool("mosquitto_pub", port, "-f", str(path)))
        conn, _ = server.accept()
        with conn:
            first, _ = _packet(conn)
            assert first >> 4 == 1, f"expected CONNECT, got {first:#x}"
            conn.sendall(CONNACK_V5)
            first = _exact(conn, 1)[0]
            began = time.perf_counter()
            assert first >> 4 == 3, f"expected PUBLISH, got {first:#x}"
            left = _remaining_length(conn)
            head = _exact(conn, 2)
            topic = _exact(conn, int.from_bytes(head, "big"))
            packet_id = _exact(conn, 2)
            left -= 2 + len(topic) + 2
            sink = bytearray(MiB)
            while left:
                got = conn.recv_into(sink, min(left, MiB))
                if not got:
                    raise ConnectionError("mosquitto_pub closed mid-PUBLISH")
                left -= got
            conn.sendall(b"\x40\x02" + packet_id)  # PUBACK, success
            _packet(conn)  # DISCONNECT
        proc.wait(60)
    return began - start


def subscriber_cost(path: Path) -> float:
    """Seconds from a PUBLISH of `path` fully handed to `mosquitto_sub`'s socket to its exit."""
    server, port = _listener()
    size = path.stat().st_size
    with server:
        proc = subprocess.Popen(_tool("mosquitto_sub", port, "-C", "1"), stdout=subprocess.DEVNULL)
        conn, _ = server.accept()
        with conn, path.open("rb") as payload:
            _packet(conn)  # CONNECT
            conn.sendall(CONNACK_V5)
            first, body = _packet(conn)
            assert first >> 4 == 8, f"expected SUBSCRIBE, got {first:#x}"
            conn.sendall(b"\x90\x04" + body[:2] + b"\x00\x01")  # SUBACK: QoS 1 granted
            variable = b"\x00\x01t" + b"\x00"  # topic "t", QoS 0, no properties
            conn.sendall(b"\x30" + encode_varint(len(variable) + size) + variable)
            conn.sendfile(payload)
            sent = time.perf_counter()
            proc.wait(60)
            ended = time.perf_counter()
    return ended - sent


def tools_cost(path: Path, rounds: int) -> tuple[float, float]:
    """Median seconds of (publisher, subscriber) own cost over `rounds` each."""
    pub = statistics.median(publisher_cost(path) for _ in range(rounds))
    sub = statistics.median(subscriber_cost(path) for _ in range(rounds))
    return pub, sub


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "payload.bin"
        path.write_bytes(os.urandom(args.size_mib * MiB))
        pub, sub = tools_cost(path, args.rounds)
    print(f"{args.size_mib} MiB: mosquitto_pub start -> first PUBLISH byte {pub:.3f} s,"
          f" mosquitto_sub last byte -> exit {sub:.3f} s")  # fmt: skip


if __name__ == "__main__":
    main()
