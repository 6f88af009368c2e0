"""Values with a place of their own, sealed with a job's codec: a durable step's result (kind
``st``, bound to its job, task and name) and a signal's payload (kind ``sg``, bound to its
queue and event key). Serialised, size-checked, compressed, then encrypted and signed (on apps
with those keys) for that place only, so a value moved to another place, planted, or written
by someone without the keys is refused before it is decoded (I9, I12). No I/O."""

from __future__ import annotations

from typing import Any, Protocol

from .compress import Compressor
from .encryption import Encrypter
from .exceptions import BadSignature, NonRetryable
from .serialize import Serializer, dumps_checked
from .signing import Signer, place


class Sealing(Protocol):
    """The parts of a codec (``_model/codec.py``) that seal a value."""

    @property
    def serializer(self) -> Serializer: ...
    @property
    def compressor(self) -> Compressor: ...
    @property
    def encrypter(self) -> Encrypter | None: ...
    @property
    def signer(self) -> Signer | None: ...
    @property
    def max_payload_bytes(self) -> int: ...


class CorruptValue(NonRetryable):
    """A recorded step result or signal payload cannot be read (garbled in Redis): the job is
    dead-lettered with this reason, rather than run again a step that already ran."""


def _bound(kind: str, task: str, name: str) -> str:
    """The place of an encrypted value (carried as the task of a sealed result)."""
    return f"\x00{kind}\x00{task}\x00{name}"


def seal_value(
    codec: Sealing, where: tuple[str, str, str], kind: str, name: str, value: Any
) -> bytes:
    """``value`` as stored at its place: ``where`` is (queue, job id, task); ``kind`` and
    ``name`` say which value of it.

    Raises:
        SerializationError: it cannot be serialised, or is over ``max_payload_bytes``.
    """
    queue, job_id, task = where
    what = f"the {'signal' if kind == 'sg' else 'result of step'} {name!r}"
    data = dumps_checked(codec.serializer, value, codec.max_payload_bytes, what)
    data = codec.compressor.compress(data)
    if codec.encrypter is not None:
        data = codec.encrypter.seal_result(queue, job_id, _bound(kind, task, name), None, data)
    if codec.signer is not None:
        data = codec.signer.sign_value(queue, job_id, task, place(kind, name), data)
    return data


def open_value(
    codec: Sealing, where: tuple[str, str, str], kind: str, name: str, data: bytes
) -> Any:
    """The value sealed at its place (see ``seal_value``), verified and decrypted before it
    is decoded.

    Raises:
        BadSignature: signing is on and it is unsigned, tampered or another place's.
        DecryptionFailed: encryption is on and it does not decrypt here, for this place.
        CorruptValue: it cannot be read otherwise.
    """
    queue, job_id, task = where
    what = f"{'signal' if kind == 'sg' else 'result of step'} {name!r}"
    if codec.signer is not None:
        data = codec.signer.verify_value(queue, job_id, task, place(kind, name), data, what)
    try:
        if codec.encrypter is not None:
            opened = codec.encrypter.open_result(queue, job_id, data)
            if opened.task != _bound(kind, task, name):
                raise ValueError("encrypted for another place")
            data = opened.data
        return codec.serializer.loads(codec.compressor.decompress(data))
    except BadSignature:  # DecryptionFailed: not this key's, or moved from another place
        raise
    except Exception as exc:
        raise CorruptValue(f"job {job_id!r}: the recorded {what} cannot be read: {exc!r}") from None
