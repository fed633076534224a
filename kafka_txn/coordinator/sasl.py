"""The SASL login on a new connection to a broker (security.protocol SASL_PLAINTEXT or
SASL_SSL), after ApiVersions and before any other request: SaslHandshake, then
SaslAuthenticate rounds (KIP-152) for PLAIN, SCRAM-SHA-256/512 (RFC 5802, KIP-84) or
OAUTHBEARER (KIP-255, the token from confluent-kafka's ``oauth_cb``), as librdkafka
logs in. A refusal is a SaslAuthenticationError: retrying will not help.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kafka_txn.coordinator.errors import AuthenticationError, SaslAuthenticationError
from kafka_txn.coordinator.messages import SASL_AUTHENTICATE, SASL_HANDSHAKE, Api
from kafka_txn.coordinator.oauthbearer import OAuthBearerError, client_first_message
from kafka_txn.coordinator.scram import ScramClient, ScramError
from kafka_txn.coordinator.settings import ConnectionSettings

__all__ = ["Request", "SaslLogin"]

Request = Callable[[Api, int, dict[str, Any]], dict[str, Any]]
"""One request on the connection and its decoded answer (``BrokerConnection.request``)."""


class SaslLogin:
    """Log in on one connection with the mechanism of ``settings``; ``address`` names the
    broker in errors."""

    def __init__(self, request: Request, settings: ConnectionSettings, address: str) -> None:
        self.request = request
        self.address = address
        self._settings = settings

    def authenticate(self) -> None:
        """SaslHandshake v1 for ``sasl.mechanism``, then its SaslAuthenticate rounds
        (KIP-152); SaslAuthenticationError when the broker refuses."""
        s = self._settings
        mechanism = s.sasl_mechanism or ""
        answer = self.request(SASL_HANDSHAKE, 1, {"mechanism": mechanism})
        if answer["error_code"]:
            raise SaslAuthenticationError(
                f"{self.address} does not offer SASL mechanism {mechanism} (enabled: "
                f"{', '.join(answer['mechanisms']) or 'none'})"
            )
        if mechanism == "OAUTHBEARER":
            self._oauthbearer()
            return
        user, password = s.sasl_username or "", s.sasl_password or ""
        if mechanism == "PLAIN":
            self._sasl_round(f"\0{user}\0{password}".encode())
            return
        scram = ScramClient(mechanism, user, password)
        try:
            server_first = self._sasl_round(scram.first())
            server_final = self._sasl_round(scram.final(server_first))
            scram.verify(server_final)
        except ScramError as exc:
            raise SaslAuthenticationError(f"SASL {mechanism} failed: {exc}") from exc

    def _oauthbearer(self) -> None:
        """KIP-255: the client-first message with the token; an empty answer is success.
        A non-empty one is the broker's error (a JSON object, RFC 7628 3.2.2): the client
        answers a lone kvsep, and the broker then fails the authentication."""
        try:
            token = self._settings.oauth_token()
        except OAuthBearerError as exc:
            raise SaslAuthenticationError(f"SASL OAUTHBEARER: {exc}") from exc
        challenge = self._sasl_round(client_first_message(token))
        if not challenge:
            return
        self._settings.forget_oauth_token()
        detail = challenge.decode("utf-8", "replace")
        try:
            self._sasl_round(b"\x01")
        except AuthenticationError as exc:
            raise SaslAuthenticationError(
                f"SASL OAUTHBEARER: {self.address} refused the token from oauth_cb: {detail} "
                f"({exc})"
            ) from exc
        raise SaslAuthenticationError(
            f"SASL OAUTHBEARER: {self.address} refused the token from oauth_cb: {detail}"
        )

    def _sasl_round(self, token: bytes) -> bytes:
        answer = self.request(SASL_AUTHENTICATE, 1, {"auth_bytes": token})
        if answer["error_code"]:
            raise SaslAuthenticationError(
                f"SASL authentication with {self.address} failed: "
                f"{answer['error_message'] or answer['error_code']}"
            )
        return bytes(answer["auth_bytes"] or b"")
