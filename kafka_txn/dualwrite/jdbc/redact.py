"""Database URLs and settings made safe to print: no password, whatever form the URL
takes. Imported by ``kafka_txn.dualwrite.jdbc.urls`` (which re-exports it); needs no extra.

A URL can carry a password where no parser of ours looks: ``?password=``, ``user:pw@``,
MySQL's ``address=(host=h)(password=pw)`` and ``(host=h,password=pw)`` forms, SQL
Server's ``;password=pw`` properties written after the database or inside a parameter's
value, percent-encoded names (``pass%77ord=``). Rather than recognising each form, a
secret-looking ``name=`` anywhere outside the parameters we split ourselves makes the URL
too dark to show (only its subprotocol is kept); inside a parameter's value it masks the
whole value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import unquote

_SECRET_WORDS: Final = (
    r"pass|pwd|secret|token|credential|private|key\.pem|api[._-]?key|jaas|oauthbearer\.config"
    r"|user\.?info"  # basic.auth.user.info: user:password
)
_SECRET_NAME: Final = re.compile(_SECRET_WORDS, re.IGNORECASE)
# A secret-looking name followed by '=' anywhere in (percent-decoded) text: the
# "password=" of ;password=pw, (password=pw), address=(...)(password=pw), pass%77ord%3D.
_SECRET_ASSIGNMENT: Final = re.compile(rf"(?:{_SECRET_WORDS})[A-Za-z0-9_.-]*\s*=", re.IGNORECASE)
# What mask_secrets() hides after such a name: up to a blank, a quote or a separator.
_SECRET_VALUE: Final = re.compile(
    rf"((?:{_SECRET_WORDS})[A-Za-z0-9_.-]*\s*=\s*)[^\s&;,)'\"]*", re.IGNORECASE
)
_PARAM_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
_PREFIX: Final = re.compile(r"(?:jdbc:)?[A-Za-z][A-Za-z0-9+.-]*:(?://)?")
_HOSTPORT: Final = re.compile(r"(?:\[[0-9A-Fa-f:.%A-Za-z]*\]|[^\[\]:@]*)(?::\d*)?")


def is_secret_name(name: str) -> bool:
    """True for a setting or URL parameter whose value is a secret (``password``,
    ``pwd``, ``passwd``, ``sasl.password``, ``trustStorePassword``, ``ssl.key.pem``,
    ``*secret*``, ``*token*``, ``basic.auth.user.info``), in any case."""
    return bool(_SECRET_NAME.search(name))


def holds_secret_assignment(text: str) -> bool:
    """True if ``text``, percent-decoded, has a secret-looking ``name=`` in it
    (``;password=``, ``(PWD=``, ``pass%77ord%3D``)."""
    return bool(_SECRET_ASSIGNMENT.search(text) or _SECRET_ASSIGNMENT.search(unquote(text)))


def mask_secrets(text: str) -> str:
    """``text`` with the value after every secret-looking ``name=`` shown as ``***``
    (up to a blank, a quote, ``&``, ``;``, ``,`` or ``)``): a last guard for messages
    that quote text a user wrote."""
    return _SECRET_VALUE.sub(r"\1***", text)


def redact_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with every secret's value (``is_secret_name``) shown as ``***``."""
    return {k: "***" if is_secret_name(str(k)) else v for k, v in settings.items()}


def _redacted_query(query: str) -> str | None:
    """The query with every secret masked, or None if it cannot be shown safely."""
    pieces = []
    for segment in query.split("&"):
        name, eq, value = segment.partition("=")
        if segment and not _PARAM_NAME.fullmatch(unquote(name)):
            return None
        secret = is_secret_name(unquote(name))
        if "@" in segment and not secret:
            return None  # perhaps the end of a password: "u:12?user=x@host"
        if eq and (secret or holds_secret_assignment(value)):  # ?user=root;password=pw
            pieces.append(f"{name}=***")
        else:
            pieces.append(segment)
    return "&".join(pieces)


def redact_jdbc_url(url: object) -> str:
    """``url`` (a JDBC or SQLAlchemy URL, well formed or not) safe to print: a password
    in ``user:password@`` becomes ``***``, and so does the value of every password-like
    parameter (``is_secret_name``) and of every parameter whose value holds a
    secret-looking ``name=`` (``?user=root;password=pw``). Internal: every error, log
    line and ``repr()`` that shows a database URL goes through it.

    When the URL cannot be taken apart without guessing where a password ends (an ``@``
    outside one clean ``user:password@host`` or a secret's value, a port that is not a
    number, a parameter name that is not a name, a secret-looking ``name=`` before the
    ``?``: ``address=(...)(password=pw)``, ``/db;password=pw``), only its subprotocol is
    kept: ``jdbc:postgresql://<redacted>``; text that does not start like a URL is not
    shown.
    """
    if not isinstance(url, str):
        return f"<{type(url).__name__}>"
    head, sep, query = url.partition("?")
    prefix_match = _PREFIX.match(head)
    if prefix_match is None:  # not a URL at all: nothing in it is known not to be secret
        return "<redacted>"
    coarse = f"{prefix_match.group(0)}<redacted>"
    if holds_secret_assignment(head):
        return coarse
    shown_query = _redacted_query(query) if sep else ""
    if shown_query is None:
        return coarse
    shown_query = sep + shown_query
    if "//" not in head:
        if "@" in head and not head.startswith("jdbc:sqlite:"):
            return coarse
        return head + shown_query
    before, _, rest = head.partition("//")
    authority, slash, path = rest.partition("/")
    if "@" in path:
        return coarse
    if "@" in authority:
        userinfo, _, hosts = authority.rpartition("@")
        if "@" in userinfo:
            return coarse
        user, colon, _ = userinfo.partition(":")
        authority = f"{user}:***@{hosts}" if colon else f"***@{hosts}"  # token@host
    else:
        hosts = authority
    if not all(_HOSTPORT.fullmatch(h) for h in hosts.split(",")):
        return coarse
    return f"{before}//{authority}{slash}{path}{shown_query}"
