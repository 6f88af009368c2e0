"""Optional HMAC signing of job payloads.

With ``App(signing_key=...)`` every payload is stored as ``MARKER + mac + payload``, where the
mac is HMAC-SHA256 over the job id, the task name and the payload; a worker with the key refuses
(dead-letters, reason ``BadSignature``) a job whose payload is unsigned or does not match, so
someone who can write to Redis can neither forge jobs nor move arguments between jobs or tasks.
Keys can be rotated: jobs signed with any of ``verify_keys`` are accepted too.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from ._exceptions import BadSignature, ConfigurationError

MARKER = b"\x00aqs1"
_MAC_LEN = 32


def _key(value: str | bytes) -> bytes:
    key = value.encode() if isinstance(value, str) else value
    if not isinstance(key, bytes) or len(key) < 16:
        raise ConfigurationError("a signing key must be at least 16 bytes")
    return key


class Signer:
    """Signs payloads with one key and verifies them against that key and older ones."""

    def __init__(self, key: str | bytes, verify_keys: Sequence[str | bytes] = ()) -> None:
        self._key = _key(key)
        self._verify = [self._key, *(_key(k) for k in verify_keys)]

    @staticmethod
    def _mac(key: bytes, job_id: str, task: str, payload: bytes) -> bytes:
        msg = b"%d:%s%d:%s" % (len(job_id), job_id.encode(), len(task), task.encode()) + payload
        return hmac.new(key, msg, hashlib.sha256).digest()

    def sign(self, job_id: str, task: str, payload: bytes) -> bytes:
        return MARKER + self._mac(self._key, job_id, task, payload) + payload

    def verify(self, job_id: str, task: str, data: bytes) -> bytes:
        """The payload inside ``data``. Raises BadSignature if it is unsigned or forged."""
        if not data.startswith(MARKER) or len(data) < len(MARKER) + _MAC_LEN:
            raise BadSignature("the job's payload is not signed (this App requires signatures)")
        mac = data[len(MARKER) : len(MARKER) + _MAC_LEN]
        payload = data[len(MARKER) + _MAC_LEN :]
        for key in self._verify:
            if hmac.compare_digest(mac, self._mac(key, job_id, task, payload)):
                return payload
        raise BadSignature("the job's payload signature does not match (tampered or foreign)")
