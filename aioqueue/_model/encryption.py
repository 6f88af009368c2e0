"""Encryption at rest of job payloads and results: AES-256-GCM (``cryptography``, the extra
``aioqueue[encryption]``), with key rotation.

With ``App(encryption_key=...)`` a job's payload (its serialised ``[args, kwargs]``, field
``p``) and its result (field ``r``, and its copy in a batch's results) are stored as

    MARKER (``\\x00aqe1``) | key id (4 bytes) | nonce (12 random bytes) | ciphertext | tag (16)

The associated data (authenticated, not stored) binds a ciphertext to its place: format
version, key prefix, queue, task, field and job id, and, for a payload, the job's stored
options (``o``): a ciphertext moved to another job, task, queue or prefix, or whose options
were changed, does not decrypt. A result's plaintext starts with the task that made it and the
batch it was made for (as a signed result does, ``_signing.py``), so a batch reader takes only
results made for its batch. With signing on too, the HMAC covers the ciphertext (encrypt then
MAC): it is checked first, and nothing is decrypted before it verifies.

Keys: each secret (at least 16 bytes) gives, through HKDF-SHA256, an AES-256 key and a 4-byte
key id stored with every value; the first key of the list encrypts, any listed key decrypts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .exceptions import ConfigurationError, DecryptionFailed
from .signing import (
    PAYLOAD_FIELD,
    RESULT_FIELD,
    SignedResult,
    _b,
    _key,
    _lp,
    key_list,
    result_head,
)

#: every encrypted value starts with the family, then its format version
FAMILY = b"\x00aqe"
MARKER = FAMILY + b"1"
_KID_LEN = 4
_NONCE_LEN = 12
_TAG_LEN = 16
_HEAD_LEN = len(MARKER) + _KID_LEN + _NONCE_LEN
_AD = b"aioqueue-aead-1\n"


def _derive(secret: bytes, info: bytes, length: int) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)


class Encrypter:
    """Encrypts with the first of ``keys``, decrypts with any of them.

    Args:
        keys: secrets of at least 16 bytes (32 random bytes recommended), newest first.
        prefix: the App's key prefix, part of every value's associated data.
    """

    __slots__ = ("_aeads", "_first", "_head")

    def __init__(self, keys: Sequence[str | bytes], prefix: str) -> None:
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError:  # pragma: no cover - exercised only without the extra
            raise ConfigurationError(
                "encryption_key needs the cryptography package: pip install 'aioqueue[encryption]'"
            ) from None
        self._aeads: dict[bytes, AESGCM] = {}
        for raw in keys:
            secret = _key(raw, "an encryption key")
            kid = _derive(secret, b"aioqueue-encryption-key-id-1", _KID_LEN)
            if kid in self._aeads:
                raise ConfigurationError("encryption_key lists the same key twice")
            self._aeads[kid] = AESGCM(_derive(secret, b"aioqueue-aes-256-gcm-1", 32))
        self._first = next(iter(self._aeads))
        self._head = _AD + _lp(_b(prefix))

    def _ad(self, queue: str, task: str, field: bytes, job_id: str, extra: bytes) -> bytes:
        return self._head + _lp(_b(queue), _b(task), field, _b(job_id), extra)

    def _seal(self, ad: bytes, plain: bytes) -> bytes:
        nonce = os.urandom(_NONCE_LEN)
        return MARKER + self._first + nonce + self._aeads[self._first].encrypt(nonce, plain, ad)

    def _open(self, ad: bytes, data: bytes, what: str) -> bytes:
        if not data.startswith(MARKER) or len(data) < _HEAD_LEN + _TAG_LEN:
            raise DecryptionFailed(f"the job's {what} is not encrypted (this App requires it)")
        kid = data[len(MARKER) : len(MARKER) + _KID_LEN]
        aead = self._aeads.get(kid)
        if aead is None:
            raise DecryptionFailed(
                f"the job's {what} is encrypted with a key not listed here (key id {kid.hex()})"
            )
        nonce = data[len(MARKER) + _KID_LEN : _HEAD_LEN]
        try:
            return aead.decrypt(nonce, data[_HEAD_LEN:], ad)
        except Exception:  # cryptography's InvalidTag: nothing more to say
            raise DecryptionFailed(
                f"the job's {what} does not decrypt (tampered, moved from another job, task, "
                "queue or prefix" + (", or its options changed)" if what == "payload" else ")")
            ) from None

    def is_current(self, data: bytes) -> bool:
        """Whether ``data`` is encrypted with the first key (what ``rekey`` leaves alone)."""
        return data[len(MARKER) : len(MARKER) + _KID_LEN] == self._first

    # ------------------------------------------------------------------ payloads
    def seal_payload(
        self, queue: str, job_id: str, task: str, options: bytes, payload: bytes
    ) -> bytes:
        """The stored form of a payload, bound to its job and to its stored ``options``."""
        return self._seal(self._ad(queue, task, PAYLOAD_FIELD, job_id, options), payload)

    def open_payload(
        self, queue: str, job_id: str, task: str, options: bytes, data: bytes
    ) -> bytes:
        """The payload inside ``data``.

        Raises:
            DecryptionFailed: not encrypted, encrypted with a key not listed, tampered, moved,
                or its options changed.
        """
        return self._open(self._ad(queue, task, PAYLOAD_FIELD, job_id, options), data, "payload")

    # ------------------------------------------------------------------ results
    def seal_result(
        self, queue: str, job_id: str, task: str, batch: tuple[str, str] | None, data: bytes
    ) -> bytes:
        """The stored form of a result: the task and batch it was made for, then the value."""
        bq, bid = batch or ("", "")
        plain = _lp(_b(task), _b(bq), _b(bid)) + data
        return self._seal(self._ad(queue, "", RESULT_FIELD, job_id, b""), plain)

    def open_result(self, queue: str, job_id: str, data: bytes) -> SignedResult:
        """The result of job ``job_id`` of ``queue`` inside ``data``, with its task and batch.

        Raises:
            DecryptionFailed: not encrypted, encrypted with a key not listed, tampered, or
                another job's.
        """
        plain = self._open(self._ad(queue, "", RESULT_FIELD, job_id, b""), data, "result")
        try:
            task, bq, bid, pos = result_head(plain)
        except ValueError:
            raise DecryptionFailed("the job's result is not an aioqueue result") from None
        return SignedResult(task.decode(), bq.decode(), bid.decode(), plain[pos:])


def encrypter_for(
    keys: str | bytes | Sequence[str | bytes] | None, prefix: str
) -> Encrypter | None:
    """The Encrypter of ``App(encryption_key=keys)`` (None: encryption off)."""
    return None if keys is None else Encrypter(key_list(keys, "encryption_key"), prefix)
