"""What people read: a Redis URL without its secrets, and text without control characters.

Every URL shown anywhere (an exception, a log line, the CLI, the dashboard) goes through
``redact_url``; every human-readable line the CLI prints, and every log line carrying data
that is not the package's own (task names, errors, hosts), through ``escape``
(docs/security.md). Standard library only.
"""

from __future__ import annotations

import logging
import re
from typing import Any

#: what the password of a URL is shown as
HIDDEN = "***"

# a query parameter whose value is a secret: password, sentinel_password, ...
_SECRET_PARAM = re.compile(r"(?i)^[^=]*(password|passwd|secret|token)[^=]*$")


def split_userinfo(rest: str) -> tuple[str, str, str]:
    """``rest`` (a URL after ``scheme://``) as ``(userinfo, "@", hosts and the rest)``, or
    ``("", "", rest)`` without credentials. A password may hold ``/``, ``?`` or ``@`` (a
    base64 one does), so the credentials end at the last ``@`` of the URL, not at the first
    ``/``: wrong only for a query value holding ``@``, and then it hides too much, never
    too little."""
    userinfo, at, tail = rest.rpartition("@")
    return userinfo, at, tail


def redact_url(url: str) -> str:
    """``url`` with every password replaced by ``***`` (the username kept): the one in the
    credentials (``redis://user:***@host``), and the value of every query parameter
    naming a password (``?password=***``, ``sentinel_password=***``). Works on any form,
    valid or not: standalone, TLS, unix, ``redis+sentinel://`` and ``redis+cluster://``
    (several hosts), and passwords holding ``/``, ``@`` or ``?``."""
    scheme, sep, rest = url.partition("://")
    if not sep:  # not a URL: a bare path or garbage; hide a query's passwords all the same
        scheme, rest = "", url
    userinfo, at, tail = split_userinfo(rest)
    if at:
        user, colon, _ = userinfo.partition(":")
        userinfo = f"{user}:{HIDDEN}" if colon else user
    head, q, query = tail.partition("?")
    if q:
        query = "&".join(_hide_param(p) for p in query.split("&"))
    return f"{scheme}{sep}{userinfo}{at}{head}{q}{query}"


def _hide_param(param: str) -> str:
    name, eq, _ = param.partition("=")
    return f"{name}={HIDDEN}" if eq and _SECRET_PARAM.match(name) else param


def redact_text(text: str, url: str) -> str:
    """``text`` (an error message that may quote ``url``, or parts of it) with the URL's
    secrets hidden: the URL itself redacted, then any password of it left alone."""
    text = text.replace(url, redact_url(url))
    for secret in secrets_of(url):
        text = text.replace(secret, HIDDEN)
    return text


def secrets_of(url: str) -> list[str]:
    """The passwords in ``url`` (as written, and percent-decoded), longest first."""
    from urllib.parse import unquote

    _, sep, rest = url.partition("://")
    found: list[str] = []
    userinfo, at, tail = split_userinfo(rest if sep else url)
    if at and ":" in userinfo:
        found.append(userinfo.partition(":")[2])
    for param in tail.partition("?")[2].split("&"):
        name, eq, value = param.partition("=")
        if eq and _SECRET_PARAM.match(name):
            found.append(value)
    found += [unquote(s) for s in found]
    return sorted({s for s in found if len(s) >= 3}, key=len, reverse=True)


# C0 controls, DEL, C1 controls, and the Unicode line separators and bidi overrides that
# reorder or break what a terminal shows
_OTHERS = "\x0b-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROL = re.compile(f"[\\x00-\\x0a{_OTHERS}]")
_CONTROL_BUT_NEWLINE = re.compile(f"[\\x00-\\x09{_OTHERS}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\e"}


def _shown(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def escape(text: str, *, newlines: bool = False) -> str:
    """``text`` with every control character (C0, DEL, C1: ESC, BEL, CR, ...; and the
    Unicode bidi overrides) shown as an escape (``\\e``, ``\\x07``), so that no planted text
    can move the cursor, retitle or clear a terminal, or forge a line; ``newlines=True``
    keeps ``\\n`` (where lines are the output's own: a table, a traceback shown
    deliberately)."""
    pattern = _CONTROL_BUT_NEWLINE if newlines else _CONTROL
    return pattern.sub(_shown, text)


class EscapingFormatter(logging.Formatter):
    """A text log formatter whose lines carry no control character: the message (which may
    quote task names, errors, hosts) escaped whole, a traceback with its newlines kept."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return escape(super().formatException(ei), newlines=True)

    def formatStack(self, stack_info: str) -> str:
        return escape(super().formatStack(stack_info), newlines=True)
