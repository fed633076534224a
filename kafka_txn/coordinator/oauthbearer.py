"""SASL/OAUTHBEARER for the coordinator client (KIP-255, RFC 7628), with the token from
the same ``oauth_cb`` the user gives confluent-kafka.

confluent-kafka calls ``oauth_cb(sasl.oauthbearer.config)`` (``None`` when that setting
is unset) and expects ``(token, expiry)`` or ``(token, expiry, principal)`` or ``(token,
expiry, principal, extensions)``, ``expiry`` in seconds since the epoch
(confluent_kafka.c, ``oauth_cb``). librdkafka refuses an expired token and checks the
token and each extension against RFC 7628's grammar, then refreshes the token when 80%
of its remaining life has passed (rdkafka_sasl_oauthbearer.c,
``rd_kafka_oauthbearer_set_token0``). ``TokenSource`` does the same; the token is only
needed when a connection authenticates, so it is refreshed then.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OAuthBearerError", "OAuthToken", "TokenSource", "client_first_message"]

_KEY = re.compile(r"[A-Za-z]+")
# RFC 7628 3.1: value = *(VCHAR / SP / HTAB / CR / LF)
_VALUE = re.compile(r"[\x21-\x7e \t\r\n]*")


class OAuthBearerError(Exception):
    """The ``oauth_cb`` failed, or returned something that cannot be sent."""


@dataclass(frozen=True)
class OAuthToken:
    """One token from ``oauth_cb``."""

    value: str = field(repr=False)
    expiry_s: float
    """Seconds since the epoch."""
    principal: str = ""
    extensions: Mapping[str, str] = field(default_factory=dict)
    refresh_after_s: float = 0.0
    """Epoch seconds after which a new token is asked for (80% of its life, as librdkafka)."""


def _check_value(what: str, value: str) -> None:
    if not _VALUE.fullmatch(value):
        raise OAuthBearerError(
            f"{what} may hold only visible ASCII characters, space, tab, CR and LF (RFC 7628)"
        )


def _parse(result: Any, now: float) -> OAuthToken:
    """``oauth_cb``'s answer as a token, checked as librdkafka checks it."""
    if not isinstance(result, tuple) or not 2 <= len(result) <= 4:
        raise OAuthBearerError(
            "oauth_cb must return (token, expiry_seconds[, principal, extensions]), got "
            f"{type(result).__name__}"
        )
    token, expiry = result[0], result[1]
    principal = result[2] if len(result) > 2 else ""
    extensions = result[3] if len(result) > 3 else {}
    if not isinstance(token, str) or not token:
        raise OAuthBearerError("oauth_cb returned an empty token or one that is not a str")
    if not isinstance(expiry, (int, float)) or isinstance(expiry, bool):
        raise OAuthBearerError("oauth_cb's expiry must be seconds since the epoch")
    if not isinstance(principal, str) or not isinstance(extensions, Mapping):
        raise OAuthBearerError("oauth_cb's principal must be a str and extensions a dict")
    if expiry <= now:
        raise OAuthBearerError(
            f"oauth_cb returned an expired token (expiry {expiry:.0f}, now {now:.0f}): "
            "expiry is seconds since the epoch, not a lifetime"
        )
    _check_value("the token", token)
    checked: dict[str, str] = {}
    for key, value in extensions.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key) or key == "auth":
            raise OAuthBearerError(
                f"SASL extension key {key!r} must be letters only and not 'auth' (RFC 7628)"
            )
        if not isinstance(value, str):
            raise OAuthBearerError(f"SASL extension {key!r} must have a str value")
        _check_value(f"SASL extension {key!r}", value)
        checked[key] = value
    return OAuthToken(token, float(expiry), principal, checked, now + 0.8 * (float(expiry) - now))


class TokenSource:
    """Tokens from ``oauth_cb``: the last one while it is fresh, a new one after 80% of
    its life. Thread-safe: connections made at the same time share one refresh."""

    def __init__(
        self,
        oauth_cb: Callable[[str | None], Any],
        config: str | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._oauth_cb = oauth_cb
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._token: OAuthToken | None = None

    def token(self) -> OAuthToken:
        with self._lock:
            now = self._clock()
            if self._token is None or now >= self._token.refresh_after_s:
                try:
                    result = self._oauth_cb(self._config)
                except Exception as exc:
                    raise OAuthBearerError(f"oauth_cb raised {exc!r}") from exc
                self._token = _parse(result, now)
            return self._token

    def forget(self) -> None:
        """Drop the current token: the next ``token()`` calls ``oauth_cb`` again."""
        with self._lock:
            self._token = None


def client_first_message(token: OAuthToken) -> bytes:
    """The KIP-255 initial client response, byte for byte as librdkafka builds it
    (``rd_kafka_sasl_oauthbearer_build_client_first_message``): GS2 header without an
    authorization id, ``auth=Bearer <token>``, then each extension, ``\\x01``-separated
    and ``\\x01``-terminated."""
    pairs = "".join(f"{key}={value}\x01" for key, value in token.extensions.items())
    return f"n,,\x01auth=Bearer {token.value}\x01{pairs}\x01".encode()
