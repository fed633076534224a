"""SASL/SCRAM-SHA-256 and -512 client exchange (RFC 5802, RFC 7677), as Kafka uses it."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

__all__ = ["ScramClient", "ScramError"]

_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


class ScramError(Exception):
    """The server's SCRAM messages were malformed or failed verification."""


def _saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


class ScramClient:
    """One SCRAM conversation: ``first()``, ``final(server_first)``,
    ``verify(server_final)``."""

    def __init__(
        self, mechanism: str, username: str, password: str, nonce: str | None = None
    ) -> None:
        if mechanism not in _HASHES:
            raise ValueError(f"unsupported SCRAM mechanism {mechanism!r}")
        self._hash = _HASHES[mechanism]
        self._password = password.encode("utf-8")
        self._nonce = nonce or secrets.token_urlsafe(24)
        self._first_bare = f"n={_saslname(username)},r={self._nonce}"
        self._auth_message = b""
        self._server_key = b""

    def first(self) -> bytes:
        return f"n,,{self._first_bare}".encode()

    def _hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self._hash).digest()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode("utf-8")
        attrs = dict(item.split("=", 1) for item in text.split(",") if "=" in item)
        try:
            nonce, salt, iterations = attrs["r"], base64.b64decode(attrs["s"]), int(attrs["i"])
        except (KeyError, ValueError) as exc:
            raise ScramError(f"malformed server-first message {text!r}") from exc
        if not nonce.startswith(self._nonce):
            raise ScramError("server nonce does not extend the client nonce")
        if iterations < 4096:
            raise ScramError(f"server asked for only {iterations} iterations (minimum 4096)")
        salted = hashlib.pbkdf2_hmac(self._hash, self._password, salt, iterations)
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        self._auth_message = f"{self._first_bare},{text},{without_proof}".encode()
        signature = self._hmac(stored_key, self._auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_key = self._hmac(salted, b"Server Key")
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        text = server_final.decode("utf-8")
        if text.startswith("e="):
            raise ScramError(f"server rejected the authentication: {text[2:]}")
        expected = base64.b64encode(self._hmac(self._server_key, self._auth_message)).decode()
        if not hmac.compare_digest(text, f"v={expected}"):
            raise ScramError("server signature does not verify: not the expected server")
