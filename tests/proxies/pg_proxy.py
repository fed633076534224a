"""A loopback TCP proxy in front of PostgreSQL that can lose the reply to a COMMIT: the
server commits, and the client's connection drops before it hears so. That is the case
a client cannot tell from a COMMIT that never arrived (DualWriter's
``DatabaseCommitUnknownError``), made certain instead of left to a race.

It reads PostgreSQL's wire protocol (v3) just enough: the client's messages, to see a
COMMIT sent as a simple query ('Q') or as a statement to parse ('P', as psycopg 3 sends
it); the server's, to see the CommandComplete ('C') whose tag is COMMIT. SSL and GSS
encryption requests are answered 'N' here (not supported), so the rest is plaintext.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

__all__ = ["PostgresProxy"]

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104


class PostgresProxy:
    """Forwards 127.0.0.1:``port`` to PostgreSQL at ``upstream`` (host, port).

    ``lose_next_commit_reply()`` arms it: the next COMMIT any client sends is forwarded,
    and once PostgreSQL answers CommandComplete "COMMIT" (the transaction is committed
    and durable), both sides of that connection are closed without passing the answer
    on. ``commits_lost`` counts the COMMITs whose reply was lost."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self._armed = 0
        self.commits_lost = 0
        self._sockets: list[socket.socket] = [self._server]
        self._closed = False
        threading.Thread(target=self._accept, name="pg-proxy", daemon=True).start()

    def lose_next_commit_reply(self) -> None:
        with self._lock:
            self._armed += 1

    def close(self) -> None:
        self._closed = True
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> PostgresProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self._sockets.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self._upstream, timeout=30)
            upstream.settimeout(None)
        except OSError:
            client.close()
            return
        self._sockets.append(upstream)
        cut = threading.Event()  # set when this connection's COMMIT reply is to be lost
        threading.Thread(
            target=self._server_to_client, args=(upstream, client, cut), daemon=True
        ).start()
        try:
            self._client_to_server(client, upstream, cut)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _client_to_server(
        self, client: socket.socket, upstream: socket.socket, cut: threading.Event
    ) -> None:
        # Startup phase: untyped messages (length, then a code), until the StartupMessage.
        while True:
            head = _read_exact(client, 8)
            length, code = struct.unpack(">ii", head)
            body = _read_exact(client, length - 8)
            if code in (_SSL_REQUEST, _GSSENC_REQUEST):
                client.sendall(b"N")  # no encryption: the client goes on in plaintext
                continue
            upstream.sendall(head + body)
            break
        while True:  # typed messages: one byte, then the length (itself included)
            kind = _read_exact(client, 1)
            (length,) = struct.unpack(">i", _read_exact(client, 4))
            body = _read_exact(client, length - 4)
            if kind in (b"Q", b"P") and _is_commit(kind, body):
                with self._lock:
                    if self._armed:
                        self._armed -= 1
                        cut.set()
            upstream.sendall(kind + struct.pack(">i", length) + body)

    def _server_to_client(
        self, upstream: socket.socket, client: socket.socket, cut: threading.Event
    ) -> None:
        try:
            while True:
                kind = _read_exact(upstream, 1)
                (length,) = struct.unpack(">i", _read_exact(upstream, 4))
                body = _read_exact(upstream, length - 4)
                if cut.is_set() and kind == b"C" and body.startswith(b"COMMIT\x00"):
                    with self._lock:
                        self.commits_lost += 1
                    return  # committed; the client never hears it
                client.sendall(kind + struct.pack(">i", length) + body)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def _is_commit(kind: bytes, body: bytes) -> bool:
    """Whether a Query ('Q': the text) or Parse ('P': a statement name, then the text)
    message carries COMMIT."""
    parts = body.split(b"\x00")
    text = parts[0] if kind == b"Q" else parts[1] if len(parts) > 1 else b""
    return text.strip().rstrip(b";").upper() == b"COMMIT"


def _read_exact(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise OSError("peer closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
