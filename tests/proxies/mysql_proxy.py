"""A loopback TCP proxy in front of MariaDB (or MySQL) that can lose the reply to a
COMMIT: the server commits, and the client's connection drops before it hears so, the
case a client cannot tell from a COMMIT that never arrived (DualWriter's
``DatabaseCommitUnknownError``), made certain instead of left to a race. The MySQL
counterpart of tests/proxies/pg_proxy.py.

It reads the MySQL wire protocol's framing only (a 3-byte little-endian payload length
and a sequence id per packet), and sees a COMMIT as the client's ``COM_QUERY`` packet
(command byte 0x03) whose text is ``COMMIT``. TLS is not supported: the client's URL must
say ``sslMode=DISABLED``.
"""

from __future__ import annotations

import contextlib
import socket
import threading

__all__ = ["MysqlCommitReplyLoser"]


class MysqlCommitReplyLoser:
    """Forwards 127.0.0.1:``port`` to the server at ``upstream`` (host, port).

    ``arm()`` arms it: the next ``COM_QUERY "COMMIT"`` any client sends is forwarded, and
    the server's answer to it (the OK: the transaction is committed) is swallowed and both
    sockets of that connection closed. ``lost`` counts the answers swallowed."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._armed = threading.Event()
        self.lost = 0
        self._sockets: list[socket.socket] = [self._server]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        self._armed.set()

    def close(self) -> None:
        self._closed = True
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._upstream, timeout=30)
            upstream.settimeout(None)
            self._sockets += [client, upstream]
            cut = threading.Event()
            threading.Thread(target=self._up, args=(client, upstream, cut), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client, cut), daemon=True).start()

    @staticmethod
    def _packet(sock: socket.socket) -> bytes:
        head = _read_exact(sock, 4)
        return head + _read_exact(sock, int.from_bytes(head[:3], "little"))

    def _up(self, client: socket.socket, upstream: socket.socket, cut: threading.Event) -> None:
        try:
            while True:
                packet = self._packet(client)
                if packet[4:] == b"\x03COMMIT" and self._armed.is_set():
                    self._armed.clear()
                    cut.set()
                upstream.sendall(packet)
        except OSError:
            pass

    def _down(self, upstream: socket.socket, client: socket.socket, cut: threading.Event) -> None:
        try:
            while True:
                packet = self._packet(upstream)
                if cut.is_set():
                    self.lost += 1
                    break  # the COMMIT's answer: never passed on
                client.sendall(packet)
        except OSError:
            pass
        for sock in (client, upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _read_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise OSError("peer closed")
        data += chunk
    return data
