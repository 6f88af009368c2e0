"""HMAC signing of everything a worker or a producer trusts from Redis.

With ``App(signing_key=...)`` two kinds of value are signed, and checked before they are used
(before a payload is decoded, an option obeyed or a result unpickled):

- a job's **payload together with its options** (record fields ``p`` and ``o``): which code
  runs, with which arguments, its timeout and result retention, the batch it is the callback
  of (whose results a chain step receives) and the batch it is a member of;
- a job's **result** (field ``r``, copied into its batch's results): it names the task that made
  it and the batch it was made for, so a batch reader takes only results made for that batch.

A third kind is never stored in Redis: a pull-API **reservation handle** (``_handle.py``),
a string a web app hands to a page; its MAC binds it to the prefix and queue.

Every MAC is HMAC-SHA256 over a context (format version, key prefix, queue, task, field, job id)
and the value, each part length-prefixed: a value verifies only where it was written for, not
in another job, task, field, queue or app prefix. Stored values start with ``MARKER`` (format
version 2); a value of the older format 1 (which covered id, task and payload only) is refused
with a message that says so. Keys can be rotated: values signed with any of ``verify_keys``
are accepted too. Signing hides nothing and cannot stop deletion, or the replay of a value in
the very place it was written for.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

from .exceptions import BadSignature, ConfigurationError

#: every signed value starts with the family, then its format version
FAMILY = b"\x00aqs"
MARKER = FAMILY + b"2"
_V1 = FAMILY + b"1"
_MAC_LEN = 32
_CONTEXT = b"aioqueue-mac-2\n"
_PLACES_KEPT = 1024

#: the record fields a MAC can be bound to (length-prefixed, as the context's last part)
PAYLOAD_FIELD = b"1:p"
RESULT_FIELD = b"1:r"
#: not a record field: the place of a stored schedule definition's MAC (``_schedauth.py``)
SCHEDULE_FIELD = b"1:s"
#: not a record field: the place of a reservation handle's MAC (``_handle.py``)
HANDLE_FIELD = b"1:h"
#: a handle's MAC is cut to 128 bits, which keeps the handle short and is still beyond guessing
HANDLE_MAC_LEN = 16


def place(kind: str, name: str) -> bytes:
    """The field of a value with a place of its own: its kind and name, length-prefixed."""
    return _lp(_b(f"{kind}:{name}"))


def _key(value: str | bytes, what: str = "a signing key") -> bytes:
    key = value.encode() if isinstance(value, str) else value
    if not isinstance(key, bytes) or len(key) < 16:
        raise ConfigurationError(f"{what} must be at least 16 bytes")
    return key


def key_list(value: str | bytes | Sequence[str | bytes], what: str) -> list[str | bytes]:
    """A key option (``signing_key``, ``encryption_key``) as a list: one key, or a list of
    keys for rotation, whose first key writes and all of which are accepted when reading."""
    keys: list[str | bytes] = [value] if isinstance(value, str | bytes) else list(value)
    if not keys:
        raise ConfigurationError(f"{what} is an empty list: give at least one key")
    return keys


_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


class _Hmac:
    """HMAC-SHA256 (RFC 2104) with one key, its padded inner and outer hash states computed
    once: several times faster per value than ``hmac.digest``, which sets the key up on every
    call (tests/test_signing.py checks it against ``hmac.digest``)."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        if len(key) > 64:  # the SHA-256 block size
            key = hashlib.sha256(key).digest()
        key = key.ljust(64, b"\0")
        self._inner = hashlib.sha256(key.translate(_IPAD))
        self._outer = hashlib.sha256(key.translate(_OPAD))

    def digest(self, msg: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(msg)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


def _b(text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:  # names read back from a garbled record may hold anything
        return text.encode("utf-8", "surrogatepass")


def _lp(*parts: bytes) -> bytes:
    """Length-prefixed parts: no two different sequences give the same bytes."""
    return b"".join(b"%d:%s" % (len(p), p) for p in parts)


def _take(data: bytes, pos: int) -> tuple[bytes, int]:
    """One length-prefixed part of ``data`` from ``pos``; ValueError if there is none."""
    colon = data.index(b":", pos, pos + 12)
    size = int(data[pos:colon])
    end = colon + 1 + size
    if size < 0 or end > len(data):
        raise ValueError("truncated")
    return data[colon + 1 : end], end


def result_head(data: bytes) -> tuple[bytes, bytes, bytes, int]:
    """The head of a result's signed (or encrypted) form: the task that made it, the batch it
    was made for (home queue, id) and where the value starts; ValueError if there is none."""
    task, pos = _take(data, 0)
    bq, pos = _take(data, pos)
    bid, pos = _take(data, pos)
    return task, bq, bid, pos


def carried(data: bytes, result: bool) -> bytes:
    """The value a stored payload (or ``result``) carries after its signature, unverified:
    for telling what it is (encrypted or not), never for using it. ``data`` if unsigned."""
    if not data.startswith(MARKER):
        return data
    rest = data[len(MARKER) + _MAC_LEN :]
    if result:
        with contextlib.suppress(ValueError):  # no head: not a result, nothing to skip
            rest = rest[result_head(rest)[3] :]
    return rest


@dataclass(frozen=True, slots=True)
class SignedResult:
    """A verified result: the task that made it, the batch it was made for (home queue and
    batch id, both '' for a job outside any batch) and the serialised value."""

    task: str
    batch_queue: str
    batch_id: str
    data: bytes


class Signer:
    """Signs values with one key, and verifies them against that key and older ones.

    Args:
        key: the signing key (at least 16 bytes), or a list of keys: the first signs, the
            others are accepted too (key rotation).
        verify_keys: more keys whose signatures are accepted (key rotation).
        prefix: the App's key prefix, part of every MAC's context.
    """

    __slots__ = ("_current", "_head", "_mac", "_older", "_places")

    def __init__(
        self,
        key: str | bytes | Sequence[str | bytes],
        verify_keys: Sequence[str | bytes] = (),
        prefix: str = "",
    ) -> None:
        first, *more = key_list(key, "signing_key")
        self._current = (first, prefix)  # what ``current()`` is made of
        self._mac = _Hmac(_key(first))
        self._older = tuple(_Hmac(_key(k)) for k in (*more, *verify_keys))
        self._head = _CONTEXT + _lp(_b(prefix))
        self._places: dict[tuple[str, str | bytes, bytes], bytes] = {}

    def current(self) -> Signer:
        """This signer with its first key only: what verifies with it needs no ``rekey``."""
        key, prefix = self._current
        return Signer(key, (), prefix)

    def _context(self, queue: str, task: str | bytes, field: bytes, job_id: str) -> bytes:
        """Version, prefix, queue, task, field and job id, each length-prefixed (all but the
        id made once per queue, task and field)."""
        place = self._places.get((queue, task, field))
        if place is None:
            if len(self._places) >= _PLACES_KEPT:  # task names read from garbled records
                self._places.clear()
            q, t = _b(queue), task if isinstance(task, bytes) else _b(task)
            place = b"%b%d:%b%d:%b%b" % (self._head, len(q), q, len(t), t, field)
            self._places[(queue, task, field)] = place
        j = _b(job_id)
        return b"%b%d:%b" % (place, len(j), j)

    def _matches(self, mac: bytes, msg: bytes) -> bool:
        if hmac.compare_digest(mac, self._mac.digest(msg)):
            return True
        # older keys (rotation) only when the current one does not match
        return any(hmac.compare_digest(mac, k.digest(msg)) for k in self._older)

    @staticmethod
    def _split(data: bytes, what: str) -> tuple[bytes, bytes]:
        """The MAC and the rest of a stored value, or BadSignature saying why not."""
        if data.startswith(MARKER) and len(data) >= len(MARKER) + _MAC_LEN:
            return data[len(MARKER) : len(MARKER) + _MAC_LEN], data[len(MARKER) + _MAC_LEN :]
        if data.startswith(_V1):
            raise BadSignature(
                f"the job's {what} has an old signature (format 1, which did not cover the "
                "options, queue and prefix); re-enqueue the job"
            )
        raise BadSignature(f"the job's {what} is not signed (this App requires signatures)")

    # ------------------------------------------------------------------ payloads
    def sign_payload(
        self, queue: str, job_id: str, task: str, options: bytes, payload: bytes
    ) -> bytes:
        """The stored form of a payload: signed together with the job's options."""
        msg = b"%b%d:%b%b" % (
            self._context(queue, task, PAYLOAD_FIELD, job_id),
            len(options),
            options,
            payload,
        )
        return MARKER + self._mac.digest(msg) + payload

    def verify_payload(
        self, queue: str, job_id: str, task: str, options: bytes, data: bytes
    ) -> bytes:
        """The payload inside ``data``, once it and ``options`` are verified for this job.

        Raises:
            BadSignature: unsigned, tampered (payload or options), written for another job,
                task, queue or prefix, or signed with a key not accepted here.
        """
        mac, payload = self._split(data, "payload")
        msg = b"%b%d:%b%b" % (
            self._context(queue, task, PAYLOAD_FIELD, job_id),
            len(options),
            options,
            payload,
        )
        if not self._matches(mac, msg):
            raise BadSignature(
                "the job's payload signature does not match its options, id, task, queue or "
                "prefix (tampered, moved, or signed with a key not accepted here)"
            )
        return payload

    # ------------------------------------------------------------------ results
    def sign_result(
        self, queue: str, job_id: str, task: str, batch: tuple[str, str] | None, data: bytes
    ) -> bytes:
        """The stored form of a job's result, bound to the job and to its batch (if any)."""
        bq, bid = batch or ("", "")
        t, q, b = _b(task), _b(bq), _b(bid)
        head = b"%d:%b%d:%b%d:%b" % (len(t), t, len(q), q, len(b), b)
        msg = self._context(queue, task, RESULT_FIELD, job_id) + head + data
        return MARKER + self._mac.digest(msg) + head + data

    def verify_result(self, queue: str, job_id: str, data: bytes) -> SignedResult:
        """The verified result of job ``job_id`` of ``queue`` inside ``data``.

        Raises:
            BadSignature: unsigned, tampered, the result of another job (or queue, or
                prefix), or signed with a key not accepted here.
        """
        mac, rest = self._split(data, "result")
        try:
            task, bq, bid, pos = result_head(rest)
        except ValueError:
            raise BadSignature("the job's result is not a signed result") from None
        msg = self._context(queue, task, RESULT_FIELD, job_id) + rest
        if not self._matches(mac, msg):
            raise BadSignature(
                f"the result of job {job_id!r} does not match its signature (tampered, another "
                "job's, or signed with a key not accepted here)"
            )
        return SignedResult(
            task.decode(errors="replace"),
            bq.decode(errors="replace"),
            bid.decode(errors="replace"),
            rest[pos:],
        )

    # ------------------------------------------------------------------ values of their own place
    def sign_value(self, queue: str, job_id: str, task: str, field: bytes, data: bytes) -> bytes:
        """The stored form of a value bound to a place of its own, ``field`` (length-prefixed,
        e.g. ``place("st", name)`` for a durable step's result): it verifies nowhere else."""
        return MARKER + self._mac.digest(self._context(queue, task, field, job_id) + data) + data

    def verify_value(
        self, queue: str, job_id: str, task: str, field: bytes, data: bytes, what: str
    ) -> bytes:
        """The value inside ``data``, once verified for its place (see ``sign_value``).

        Raises:
            BadSignature: unsigned, tampered, moved from another place, or signed with a key
                not accepted here.
        """
        mac, rest = self._split(data, what)
        if not self._matches(mac, self._context(queue, task, field, job_id) + rest):
            raise BadSignature(
                f"the {what} does not match its signature (tampered, moved from another job "
                "or place, or signed with a key not accepted here)"
            )
        return rest

    # ------------------------------------------------------------------ reservation handles
    def sign_handle(self, queue: str, body: bytes) -> bytes:
        """The MAC of a reservation handle's ``body`` for ``queue`` (and this prefix)."""
        msg = self._context(queue, "", HANDLE_FIELD, "") + body
        return self._mac.digest(msg)[:HANDLE_MAC_LEN]

    def verify_handle(self, queue: str, body: bytes, mac: bytes) -> bool:
        """Whether ``mac`` is a handle MAC of ``body`` for ``queue`` by an accepted key."""
        msg = self._context(queue, "", HANDLE_FIELD, "") + body
        if hmac.compare_digest(mac, self._mac.digest(msg)[:HANDLE_MAC_LEN]):
            return True
        return any(hmac.compare_digest(mac, k.digest(msg)[:HANDLE_MAC_LEN]) for k in self._older)

    # ------------------------------------------------------------------ schedule definitions
    def sign_schedule(self, queue: str, name: str, definition: bytes) -> str:
        """The MAC (hex) of a stored schedule definition, bound to its queue and name."""
        return self._mac.digest(self._context(queue, "", SCHEDULE_FIELD, name) + definition).hex()

    def verify_schedule(self, queue: str, name: str, definition: bytes, mac: str) -> bool:
        """Whether ``mac`` is the MAC of schedule ``name``'s ``definition`` on ``queue``, made
        with an accepted key."""
        try:
            raw = bytes.fromhex(mac)
        except (TypeError, ValueError):
            return False
        return self._matches(raw, self._context(queue, "", SCHEDULE_FIELD, name) + definition)
