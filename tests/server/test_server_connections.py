"""Connection-level limits of a live server (`hyla.server.connections`): request-head deadline,
connection cap, TCP_NODELAY.

Oracles: the socket option read back from the server's accepted sockets; whether the server
closed a connection (EOF on the client's side) or answered it (its status line).
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest

HEAD = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def _connect(server) -> socket.socket:
    host, port = server.url.rsplit("//", 1)[1].split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """Everything the server sends, and whether it closed the connection within `timeout`."""
    sock.settimeout(timeout)
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except TimeoutError:
        return received, False
    except ConnectionResetError:
        pass
    return received, True


def _read_response(sock: socket.socket) -> bytes:
    received = b""
    while b"\r\n\r\n" not in received or not received.endswith(b"}"):
        chunk = sock.recv(4096)
        assert chunk, f"closed by the server after {received!r}"
        received += chunk
    return received


def test_accepted_connections_have_tcp_nodelay(server):
    with _connect(server) as sock:
        sock.sendall(HEAD)
        assert _read_response(sock).startswith(b"HTTP/1.1 200")
        protocols = list(server.server.server_state.connections)
        assert protocols
        for protocol in protocols:
            server_sock = protocol.transport.get_extra_info("socket")
            assert server_sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


@pytest.fixture(scope="module")
def guarded(make_server):
    return make_server(
        server_options={"header_timeout": 1.0, "timeout_keep_alive": 60, "max_connections": 8}
    )


def test_slow_header_connection_is_answered_408_and_closed(guarded):
    with _connect(guarded) as sock:
        for byte in HEAD[:10]:  # a byte at a time, then nothing: never the whole head
            sock.sendall(bytes([byte]))
            time.sleep(0.05)
        received, closed = _read_until_closed(sock, timeout=10)
    assert closed
    assert received.startswith(b"HTTP/1.1 408"), received


def test_silent_connection_is_closed_without_an_answer(guarded):
    with _connect(guarded) as sock:
        received, closed = _read_until_closed(sock, timeout=10)
    assert closed and received == b""


def test_kept_alive_connection_has_a_deadline_for_its_next_head(guarded):
    with _connect(guarded) as sock:
        sock.sendall(HEAD)
        assert _read_response(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(HEAD[:10])  # timeout_keep_alive (60 s) alone would keep it
        received, closed = _read_until_closed(sock, timeout=10)
    assert closed and received.startswith(b"HTTP/1.1 408")


def test_a_whole_head_then_a_slow_client_is_not_cut_by_the_head_deadline(guarded):
    with _connect(guarded) as sock:
        sock.sendall(HEAD)
        time.sleep(1.5)  # the response is waiting; reading it late is the client's business
        assert _read_response(sock).startswith(b"HTTP/1.1 200")
        time.sleep(1.5)  # idle between requests: timeout_keep_alive's (60 s), not the head's
        sock.sendall(HEAD)
        assert _read_response(sock).startswith(b"HTTP/1.1 200")


def test_connection_cap_sheds_slow_header_connections_first(make_server):
    server = make_server(server_options={"header_timeout": 60.0, "max_connections": 8})
    slow = [_connect(server) for _ in range(20)]
    try:
        for sock in slow:
            sock.sendall(HEAD[:5])
        for _ in range(3):  # each answered although 8 connections wait for their heads
            assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
        closed = [_read_until_closed(sock, timeout=0.5)[1] for sock in slow]
    finally:
        for sock in slow:
            sock.close()
    assert sum(closed) >= 20 - 8  # the oldest ones, at most 8 stay
    assert not any(closed[-4:])  # the newest are kept
