"""The coordinator client's TLS context, built from librdkafka's ``ssl.*`` settings with
Python's ssl module, doing what librdkafka's rdkafka_ssl.c does with each of them.

Every failure to load something is a ``ConfigurationError`` naming the key, raised when
the producer is built (``ConnectionSettings.from_librdkafka`` builds a context once to
check), not when recovery first needs the coordinator.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from kafka_txn.errors import ConfigurationError

__all__ = ["TlsSettings"]


@dataclass(frozen=True)
class TlsSettings:
    """The ``ssl.*`` settings that decide how the coordinator client speaks TLS."""

    ca_location: str | None = None
    ca_pem: str | None = field(default=None, repr=False)
    crl_location: str | None = None
    certificate_location: str | None = None
    certificate_pem: str | None = field(default=None, repr=False)
    key_location: str | None = None
    key_pem: str | None = field(default=None, repr=False)
    key_password: str | None = field(default=None, repr=False)
    cipher_suites: str | None = None
    verify: bool = True
    """``enable.ssl.certificate.verification``."""
    check_hostname: bool = True
    """``ssl.endpoint.identification.algorithm=https``."""

    def context(self) -> ssl.SSLContext:
        """A client context; ConfigurationError naming the key if something cannot be
        loaded."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # TLS >= 1.2, verify + check_hostname
        self._load_trust(ctx)
        self._load_client_certificate(ctx)
        if self.cipher_suites:
            try:
                ctx.set_ciphers(self.cipher_suites)
            except ssl.SSLError as exc:
                raise ConfigurationError(
                    f"ssl.cipher.suites={self.cipher_suites!r} selects no cipher OpenSSL "
                    f"knows ({_why(exc)})"
                ) from exc
        if not self.verify:
            # librdkafka: enable.ssl.certificate.verification=false accepts any
            # certificate; the host name is checked by the same verification, so neither.
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx.check_hostname = self.check_hostname
        return ctx

    # ------------------------------------------------------------------ trust
    def _load_trust(self, ctx: ssl.SSLContext) -> None:
        location = self.ca_location
        if (not location and not self.ca_pem) or location == "probe":
            # librdkafka: no CA configured (or "probe") -> the system's CA store.
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
        if location and location != "probe":
            try:
                if os.path.isdir(location):  # librdkafka passes a directory as CApath
                    ctx.load_verify_locations(capath=location)
                else:
                    ctx.load_verify_locations(cafile=location)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigurationError(
                    f"ssl.ca.location={location!r} cannot be loaded: {_why(exc)}"
                ) from exc
        if self.ca_pem:
            try:
                ctx.load_verify_locations(cadata=self.ca_pem)
            except (ssl.SSLError, ValueError) as exc:
                raise ConfigurationError(
                    f"ssl.ca.pem is not a PEM certificate (or list of them): {_why(exc)}"
                ) from exc
        if self.crl_location:
            try:
                ctx.load_verify_locations(cafile=self.crl_location)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigurationError(
                    f"ssl.crl.location={self.crl_location!r} cannot be loaded: {_why(exc)}"
                ) from exc
            # rdkafka_ssl.c: X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK), which
            # checks the broker's own certificate (the leaf) against the CRL.
            ctx.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF

    # ------------------------------------------------------------------ client cert
    def _load_client_certificate(self, ctx: ssl.SSLContext) -> None:
        for a, b in (
            ("ssl.certificate.location", "ssl.certificate.pem"),
            ("ssl.key.location", "ssl.key.pem"),
        ):
            if getattr(self, _attr(a)) and getattr(self, _attr(b)):
                raise ConfigurationError(f"set {a} or {b}, not both")
        has_cert = bool(self.certificate_location or self.certificate_pem)
        has_key = bool(self.key_location or self.key_pem)
        cert_key = "ssl.certificate.location" if self.certificate_location else (
            "ssl.certificate.pem"
        )  # fmt: skip
        key_key = "ssl.key.location" if self.key_location else "ssl.key.pem"
        if has_key and not has_cert:
            raise ConfigurationError(
                f"{key_key} is set without a client certificate: set "
                "ssl.certificate.location or ssl.certificate.pem too"
            )
        if not has_cert:
            return
        for key, path in ((cert_key, self.certificate_location), (key_key, self.key_location)):
            if path and not os.path.isfile(path):
                raise ConfigurationError(f"{key}={path!r} is not a file")
        asked: list[bool] = []
        password = self._password_callback(asked)
        with (
            _pem_file(self.certificate_pem, self.certificate_location) as certfile,
            _pem_file(self.key_pem, self.key_location) as keyfile,
        ):
            try:
                ctx.load_cert_chain(certfile, keyfile or None, password)
            except ssl.SSLError as exc:
                raise self._load_failure(exc, asked, cert_key, key_key) from exc
            except OSError as exc:
                raise ConfigurationError(
                    f"{cert_key} / {key_key} cannot be read: {_why(exc)}"
                ) from exc

    def _password_callback(self, asked: list[bool]) -> Callable[[], str]:
        """The key's password for OpenSSL. Without ``ssl.key.password`` this answers an
        empty one (so an encrypted key fails, naming the key) instead of letting OpenSSL
        prompt on the terminal."""

        def password() -> str:
            asked.append(True)
            return self.key_password or ""

        return password

    def _load_failure(
        self, exc: ssl.SSLError, asked: list[bool], cert_key: str, key_key: str
    ) -> ConfigurationError:
        reason = _why(exc)
        if asked and not self.key_password:
            return ConfigurationError(
                f"{key_key} is an encrypted key: set ssl.key.password ({reason})"
            )
        if asked:
            return ConfigurationError(f"ssl.key.password does not decrypt {key_key} ({reason})")
        if "KEY_VALUES_MISMATCH" in reason.upper():
            return ConfigurationError(f"{key_key} is not the key of {cert_key}")
        return ConfigurationError(
            f"{cert_key} / {key_key} cannot be loaded as a PEM certificate and key: {reason}"
        )


def _attr(key: str) -> str:
    return key.removeprefix("ssl.").replace(".", "_")


def _why(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    if isinstance(exc, ssl.SSLError) and reason:
        return str(reason)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


@contextlib.contextmanager
def _pem_file(pem: str | None, location: str | None) -> Iterator[str]:
    """``location``, or ``pem`` written to a private temporary file (mode 0600, removed
    on exit): Python's ssl module loads certificates and keys from files only."""
    if not pem:
        yield location or ""
        return
    fd, path = tempfile.mkstemp(prefix="kafka-txn-", suffix=".pem")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(pem if pem.endswith("\n") else pem + "\n")
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
