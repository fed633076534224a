"""Test certificates made with the ``openssl`` command line tool: a CA, broker
certificates (one naming 127.0.0.1/localhost, one naming another host, one revoked), a
client certificate with a password-protected key, a second unrelated CA, and CRLs.
Elliptic-curve keys (P-256), so that making them all takes well under a second."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Certificates", "make_certificates"]

KEY_PASSWORD = "client-key-pw"


@dataclass(frozen=True)
class Certificates:
    """Paths of the PEM files (``text(name)`` reads one)."""

    folder: Path
    ca: Path
    other_ca: Path
    server_cert: Path
    server_key: Path
    wrong_name_cert: Path
    wrong_name_key: Path
    revoked_cert: Path
    revoked_key: Path
    client_cert: Path
    client_key: Path
    client_key_encrypted: Path
    crl_revoking: Path
    """Revokes ``revoked_cert``."""
    crl_empty: Path
    """Revokes nothing (issued before the revocation)."""
    key_password: str = KEY_PASSWORD

    @staticmethod
    def text(path: Path) -> str:
        return path.read_text()


def _openssl(folder: Path, *args: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the TLS tests need the openssl command line tool")
    subprocess.run(
        [openssl, *args], cwd=folder, check=True, capture_output=True, text=True, timeout=60
    )


def _ca(folder: Path, name: str) -> None:
    _openssl(
        folder, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
        "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "3",
        "-subj", f"/CN=kafka-txn test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip


def _leaf(folder: Path, name: str, san: str, usage: str) -> None:
    (folder / f"{name}.ext").write_text(
        f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n"
        f"keyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\n"
    )
    _openssl(
        folder, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
        "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
    )  # fmt: skip
    _openssl(
        folder, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext",
    )  # fmt: skip


def _crls(folder: Path) -> None:
    """``openssl ca`` keeps its state in an index file: one CRL before revoking
    ``revoked.pem``, one after."""
    (folder / "index.txt").write_text("")
    (folder / "crlnumber").write_text("01\n")
    (folder / "ca.cnf").write_text(
        "[ca]\ndefault_ca = test_ca\n[test_ca]\ndatabase = index.txt\n"
        "crlnumber = crlnumber\ndefault_md = sha256\ndefault_crl_days = 2\n"
    )
    ca = ("-config", "ca.cnf", "-keyfile", "ca.key", "-cert", "ca.pem")
    _openssl(folder, "ca", *ca, "-gencrl", "-out", "crl-empty.pem")
    _openssl(folder, "ca", *ca, "-revoke", "revoked.pem")
    _openssl(folder, "ca", *ca, "-gencrl", "-out", "crl-revoking.pem")


def make_certificates(folder: Path) -> Certificates:
    """Every certificate and key the TLS tests use, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    _ca(folder, "ca")
    _ca(folder, "other-ca")
    _leaf(folder, "server", "DNS:localhost,IP:127.0.0.1", "serverAuth")
    _leaf(folder, "wrong-name", "DNS:broker.invalid", "serverAuth")
    _leaf(folder, "revoked", "DNS:localhost,IP:127.0.0.1", "serverAuth")
    _leaf(folder, "client", "DNS:kafka-txn-client", "clientAuth")
    _openssl(
        folder, "pkey", "-in", "client.key", "-aes256", "-passout", f"pass:{KEY_PASSWORD}",
        "-out", "client-encrypted.key",
    )  # fmt: skip
    _crls(folder)
    return Certificates(
        folder=folder,
        ca=folder / "ca.pem",
        other_ca=folder / "other-ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server.key",
        wrong_name_cert=folder / "wrong-name.pem",
        wrong_name_key=folder / "wrong-name.key",
        revoked_cert=folder / "revoked.pem",
        revoked_key=folder / "revoked.key",
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
        client_key_encrypted=folder / "client-encrypted.key",
        crl_revoking=folder / "crl-revoking.pem",
        crl_empty=folder / "crl-empty.pem",
    )
