"""Reservation handles: a pull-API reservation as a short string, and back.

A web app that leases a job in one request and completes it in another (in any process) keeps
the handle, in a form field, a URL or a session, instead of the ``Reservation`` object. The
handle carries what ``complete``, ``fail``, ``release`` and ``extend`` need: queue, job id,
lease token, task, attempt, attempts allowed, and the options completion reads (the batch the
job is a member of, its result retention). Not the arguments: a handle stays short.

Forms (``body`` is the fields as compact JSON, base64url without padding)::

    aq1.<body>              an App without a signing key
    aq1s.<body>.<mac>       an App with one: HMAC-SHA256 over prefix, queue and body (_signing.py)

Without a key a handle is only as secret as the lease token in it, which is random and
unguessable: whoever holds the handle holds the lease, exactly as whoever holds the token.
With a key, a handle cannot be forged or edited (to another queue, job, task or batch).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
from dataclasses import dataclass
from typing import Any

from .checks import check_job_id
from .exceptions import ConfigurationError, InvalidHandle
from .signing import HANDLE_MAC_LEN, Signer

UNSIGNED = "aq1."
SIGNED = "aq1s."
#: longer strings are refused unread (a real handle is a few hundred characters)
MAX_HANDLE_CHARS = 4096
#: the options a handle keeps: those completion reads (Codec.dump_result, result_ttl_ms)
KEPT_OPTIONS = ("member", "result_ttl")


@dataclass(frozen=True, slots=True)
class HandleFields:
    """What a handle carries."""

    queue: str
    job_id: str
    token: str
    task: str
    attempt: int
    max_attempts: int
    options: dict[str, Any]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text or not text.isascii():
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def dump_handle(signer: Signer | None, f: HandleFields) -> str:
    """The handle of a reservation (signed with ``signer``, if any)."""
    kept = {k: f.options[k] for k in KEPT_OPTIONS if k in f.options}
    fields = [f.queue, f.job_id, f.token, f.task, f.attempt, f.max_attempts, kept]
    body = json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()
    if signer is None:
        return UNSIGNED + _b64(body)
    return f"{SIGNED}{_b64(body)}.{_b64(signer.sign_handle(f.queue, body))}"


def load_handle(signer: Signer | None, queue: str, handle: object) -> HandleFields:
    """The fields of ``handle``, checked: a handle of ``queue``, well-formed, and (with
    ``signer``) signed for this queue and prefix by an accepted key.

    Raises:
        InvalidHandle: it is none of that.
    """
    if not isinstance(handle, str):
        raise InvalidHandle(f"a reservation handle is a string, not {type(handle).__name__}")
    if len(handle) > MAX_HANDLE_CHARS:
        raise InvalidHandle(f"not a reservation handle: {len(handle):,} characters")
    if handle.startswith(SIGNED):
        if signer is None:
            raise InvalidHandle("the handle is signed, but this App has no signing_key")
        body_text, _, mac_text = handle[len(SIGNED) :].partition(".")
        body = _decode(body_text)
        try:
            mac = _unb64(mac_text)
        except (ValueError, binascii.Error):
            mac = b""  # missing or garbled: it matches nothing
        if len(mac) == HANDLE_MAC_LEN and signer.verify_handle(queue, body, mac):
            fields = _parse(body)  # nothing is read before it is verified
            _check_queue(fields, queue)
            return fields
        other: HandleFields | None = None
        with contextlib.suppress(InvalidHandle):
            other = _parse(body)
        if other is not None and mac and signer.verify_handle(other.queue, body, mac):
            _check_queue(other, queue)  # a genuine handle of another queue: say so
        raise InvalidHandle(
            "the handle's signature does not match (tampered, made by another App or prefix, "
            "or signed with a key not accepted here)"
        )
    if handle.startswith(UNSIGNED):
        if signer is not None:
            raise InvalidHandle("the handle is not signed (this App requires signatures)")
        fields = _parse(_decode(handle[len(UNSIGNED) :]))
        _check_queue(fields, queue)
        return fields
    raise InvalidHandle("not a reservation handle (it starts with neither 'aq1.' nor 'aq1s.')")


def _decode(text: str) -> bytes:
    try:
        return _unb64(text)
    except (ValueError, binascii.Error):
        raise InvalidHandle("not a reservation handle: garbled") from None


def _parse(body: bytes) -> HandleFields:
    try:
        value = json.loads(body)
        queue, job_id, token, task, attempt, max_attempts, options = value
        if not all(isinstance(s, str) for s in (queue, token, task)) or not token:
            raise ValueError("queue, token and task must be strings")
        if not all(type(n) is int and n >= 1 for n in (attempt, max_attempts)):
            raise ValueError("attempts must be positive integers")
        if not isinstance(options, dict) or not set(options) <= set(KEPT_OPTIONS):
            raise ValueError("unexpected options")
        check_job_id(job_id)
    except (ValueError, TypeError, ConfigurationError) as exc:  # JSONDecodeError, unpacking
        raise InvalidHandle(f"not a reservation handle: {exc}") from None
    return HandleFields(queue, job_id, token, task, attempt, max_attempts, options)


def _check_queue(fields: HandleFields, queue: str) -> None:
    if fields.queue != queue:
        raise InvalidHandle(
            f"the handle is for queue {fields.queue!r}, not {queue!r}: "
            f"use app.queue({fields.queue!r}).reservation_from(...)"
        )
