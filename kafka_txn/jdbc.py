"""JDBC URLs, as Spark users write them, to SQLAlchemy URLs.

    jdbc:postgresql://host[:port]/db[?user=u&password=p&...]  -> postgresql+psycopg://
    jdbc:mysql://host[:port]/db[?...]                        -> mysql+pymysql://
    jdbc:mariadb://host[:port]/db[?...]                      -> mysql+pymysql://
    jdbc:sqlite:path  |  jdbc:sqlite::memory:                -> sqlite:///path

``user``/``password`` may come as arguments or as URL parameters (arguments win); other
parameters pass to the driver unchanged. Anything else raises ``ConfigurationError``
naming the problem and listing what is supported.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

from sqlalchemy.engine import URL

from .errors import ConfigurationError

__all__ = ["SUPPORTED_SCHEMES", "jdbc_to_sqlalchemy"]

_DRIVERS = {
    "postgresql": ("postgresql+psycopg", 5432),
    "mysql": ("mysql+pymysql", 3306),
    "mariadb": ("mysql+pymysql", 3306),
}
SUPPORTED_SCHEMES = ("jdbc:postgresql://", "jdbc:mysql://", "jdbc:mariadb://", "jdbc:sqlite:")
_MAX_URL = 4096


def _bad(url: str, problem: str) -> ConfigurationError:
    shown = url if len(url) <= 120 else url[:117] + "..."
    return ConfigurationError(
        f"invalid JDBC URL {shown!r}: {problem}. Supported: {', '.join(SUPPORTED_SCHEMES)}"
    )


def jdbc_to_sqlalchemy(url: str, *, user: str | None = None, password: str | None = None) -> URL:
    """The SQLAlchemy URL for a JDBC URL (see the module docstring)."""
    if not isinstance(url, str):
        raise ConfigurationError(f"a JDBC URL is a str, got {type(url).__name__}")
    if len(url) > _MAX_URL:
        raise _bad(url, f"longer than {_MAX_URL} characters")
    if any(ch in url for ch in "\r\n\x00"):
        raise _bad(url, "it contains a control character")
    if not url.startswith("jdbc:"):
        raise _bad(url, "it does not start with 'jdbc:'")
    rest = url[len("jdbc:") :]
    scheme, sep, tail = rest.partition(":")
    if not sep:
        raise _bad(url, "no ':' after the subprotocol")
    if scheme == "sqlite":
        return _sqlite(url, tail)
    if scheme not in _DRIVERS:
        raise _bad(url, f"unsupported subprotocol {scheme!r}")
    if not tail.startswith("//"):
        raise _bad(url, f"expected jdbc:{scheme}://host[:port]/database")
    try:
        parts = urlsplit(f"x:{tail}")
        port = parts.port
    except ValueError as exc:
        raise _bad(url, f"bad host or port ({exc})") from None
    if not parts.hostname:
        raise _bad(url, "no host")
    database = parts.path.lstrip("/")
    if not database or "/" in database:
        raise _bad(url, "expected exactly one database name after the host")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    if parts.username or parts.password:
        raise _bad(url, "put credentials in ?user=&password= or the arguments, not user@host")
    url_user = query.pop("user", None)
    url_password = query.pop("password", None)
    driver, default_port = _DRIVERS[scheme]
    return URL.create(
        driver,
        username=user if user is not None else url_user,
        password=password if password is not None else url_password,
        host=parts.hostname,
        port=port or default_port,
        database=database,
        query=query,
    )


def _sqlite(url: str, tail: str) -> URL:
    path, _, _ = tail.partition("?")
    if path in ("", ":memory:"):
        return URL.create("sqlite")  # SQLAlchemy's in-memory database
    if path.startswith("//"):
        raise _bad(url, "SQLite takes a file path: jdbc:sqlite:/abs/path.db or jdbc:sqlite:rel.db")
    return URL.create("sqlite", database=path)
