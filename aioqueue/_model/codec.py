"""The codec: how a job's arguments, options, result and errors are stored, and read back.

One place for every (de)serialisation of a job record, used alike by the producer (enqueue),
the worker and the pull API, so a corrupt value is judged the same way wherever it is read.
"""

from __future__ import annotations

import traceback as tb
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, Protocol

from .claimcheck import (
    ClaimCheck,
    ClaimChecker,
    MissingPayload,
    PayloadStore,
    check_blob,
    is_reference,
    job_key,
)
from .compress import Compression, CompressionError, Compressor, decompressed_cap
from .encryption import FAMILY as ENCRYPTED
from .encryption import Encrypter, encrypter_for
from .exceptions import (
    BadSignature,
    ConfigurationError,
    CorruptRecord,
    DecryptionFailed,
    PayloadTooLarge,
    SerializationError,
)
from .job import ErrorInfo
from .serialize import JsonSerializer, Serializer, dumps_checked
from .signing import FAMILY, SignedResult, Signer, carried

#: the option naming the batch a sub-job belongs to (home queue, batch id); see Codec.member_options
MEMBER_OPTION = "member"
#: the W3C traceparent the job being read carried (a third element of its payload, written
#: by a producer with tracing on: aioqueue.otel); set by ``load_job`` only when there is one,
#: in the reading task's context (a worker runs each job in a task of its own)
carried_trace: ContextVar[str | None] = ContextVar("aioqueue_carried_trace", default=None)
#: a key option's value: one key, or a list for rotation (the first writes)
Key = str | bytes | Sequence[str | bytes]


class CodecOwner(Protocol):
    """What ``Codec.of`` reads of its App (an ``App`` satisfies it)."""

    @property
    def prefix(self) -> str: ...
    @property
    def serializer(self) -> Serializer: ...
    @property
    def max_payload_bytes(self) -> int: ...
    @property
    def result_ttl_default_ms(self) -> int: ...


class Unrunnable(Exception):
    """A reason a job could not run, recorded under its own type name (``kind``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def error_type(error: BaseException) -> str:
    """The type name a failure is recorded under (an Unrunnable's kind, else its class)."""
    return getattr(error, "kind", None) or type(error).__name__


def describe_error(error: BaseException) -> str:
    """A failure as the record stores it, for logs: ``"JobTimeout: job exceeded ..."``."""
    message = str(error)
    return f"{error_type(error)}: {message}" if message else error_type(error)


class Codec:
    """Encodes and decodes the parts of a job record for one App.

    Args:
        serializer: for arguments and results.
        signer: signs payloads (and checks them) when signing is on.
        encrypter: encrypts payloads and results (and decrypts them) when encryption is on.
        max_payload_bytes: refuse arguments that serialise to more (0: no limit).
        result_ttl_ms: the App's retention of finished jobs (-1: forever).
    """

    __slots__ = (
        "claim",
        "compressor",
        "encrypter",
        "json",
        "max_payload_bytes",
        "result_ttl_default_ms",
        "serializer",
        "signer",
        "trace",
    )

    def __init__(
        self,
        serializer: Serializer,
        signer: Signer | None,
        max_payload_bytes: int,
        result_ttl_ms: int,
        encrypter: Encrypter | None = None,
    ) -> None:
        self.serializer = serializer
        self.encrypter = encrypter
        self.json: Serializer = JsonSerializer()
        self.signer = signer
        self.max_payload_bytes = max_payload_bytes
        self.result_ttl_default_ms = result_ttl_ms
        #: with tracing on (aioqueue.otel.instrument): called with (queue, job id, task) for
        #: each job made, the W3C traceparent to carry in its payload, signed with it; None
        #: (the default): payloads carry none
        self.trace: Callable[[str, str, str], str | None] | None = None
        #: compression of payloads and results (``_compress.py``): off unless configured, but
        #: always able to read a compressed value (within the cap)
        self.compressor = Compressor(None, decompressed_cap(max_payload_bytes))
        #: claim-check of large payloads (``_claimcheck.py``), with App(payload_store=...)
        self.claim: ClaimChecker | None = None

    @classmethod
    def of(
        cls,
        app: CodecOwner,
        keys: tuple[Key | None, Sequence[str | bytes], Key | None],
        compression: str | Compression | None,
        payload_store: PayloadStore | ClaimCheck | None,
    ) -> Codec:
        """The codec of ``app`` with these settings (see App's arguments): ``keys`` are its
        ``signing_key``, ``verify_keys`` and ``encryption_key``."""
        signing_key, verify_keys, encryption_key = keys
        if verify_keys and signing_key is None:
            raise ConfigurationError("verify_keys needs a signing_key")
        signer = None if signing_key is None else Signer(signing_key, verify_keys, app.prefix)
        codec = cls(app.serializer, signer, app.max_payload_bytes, app.result_ttl_default_ms)
        codec.encrypter = encrypter_for(encryption_key, app.prefix)
        cap = decompressed_cap(app.max_payload_bytes)
        codec.compressor = Compressor(compression, cap)
        if payload_store is not None:
            codec.claim = ClaimChecker(payload_store, app.prefix)
        return codec

    # ------------------------------------------------------------------ arguments
    def dump_args(
        self,
        queue: str,
        job_id: str,
        task: str,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        options: bytes = b"",
    ) -> bytes:
        """The stored payload of a job: its serialised arguments, signed together with its
        stored ``options`` (and bound to its queue, id and task) if signing is on."""
        value: list[Any] = [list(args), dict(kwargs)]
        if self.trace is not None:
            parent = self.trace(queue, job_id, task)
            if parent:  # [args, kwargs, meta]: read by workers of this release on, tracing or not
                value.append({"traceparent": parent})
        data = self.compressor.compress(dumps_checked(self.serializer, value, 0, "job arguments"))
        check_size(data, self.max_payload_bytes, "job arguments")
        return self._seal_payload(queue, job_id, task, options, data)

    def _seal_payload(
        self, queue: str, job_id: str, task: str, options: bytes, data: bytes
    ) -> bytes:
        """Serialised (and compressed) arguments as stored: encrypted (if on), kept in the
        payload store with a reference in their place (if on, and over its threshold), then
        signed (if on)."""
        if self.encrypter is not None:
            data = self.encrypter.seal_payload(queue, job_id, task, options, data)
        if self.claim is not None:
            data = self.claim.dump(queue, job_id, data)
        if self.signer is None:
            return data
        return self.signer.sign_payload(queue, job_id, task, options, data)

    def _open_payload(
        self,
        queue: str,
        job_id: str,
        task: str,
        options: bytes,
        payload: bytes,
        blob: bytes | None = None,
    ) -> bytes:
        """The serialised (maybe compressed) arguments of a stored payload: its signature
        checked (if on), its blob taken in place of its reference (if it has one: ``blob``,
        read from the payload store, checked against the reference), then decrypted (if on);
        nothing else is read from it before.

        Raises:
            BadSignature: signing is on and the payload or options are unsigned or forged.
            DecryptionFailed: encrypted and not decryptable here, or not encrypted though
                encryption is on.
            Unrunnable: ``CorruptPayload``, signed but this App has no signing key;
                ``MissingPayload``/``TamperedPayload``, a reference whose blob is missing or
                not the one enqueued.
        """
        if self.signer is not None:
            payload = self.signer.verify_payload(queue, job_id, task, options, payload)
        elif payload.startswith(FAMILY):
            raise Unrunnable(
                "CorruptPayload", "the payload is signed, but this App has no signing_key"
            )
        if is_reference(payload):
            if self.claim is None:
                raise Unrunnable(
                    "MissingPayload",
                    "the payload is in a payload store, but this App has no payload_store",
                )
            try:
                payload = check_blob(payload, job_key(self.claim.prefix, queue, job_id), blob)
            except MissingPayload as exc:
                raise Unrunnable(exc.kind, str(exc)) from None
        if self.encrypter is not None:
            return self.encrypter.open_payload(queue, job_id, task, options, payload)
        if payload.startswith(ENCRYPTED):
            raise DecryptionFailed("the payload is encrypted, but this App has no encryption_key")
        return payload

    @staticmethod
    def is_encrypted(data: bytes, result: bool = False) -> bool:
        """Whether a stored payload (or ``result``) is encrypted, signed or not (unverified)."""
        return carried(data, result).startswith(ENCRYPTED)

    def load_args(
        self, queue: str, job_id: str, task: str, payload: bytes, options: bytes = b""
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """A job's arguments from its stored payload (checking its signature if configured).

        Raises:
            BadSignature: signing is on and the payload or options are unsigned or forged.
            Unrunnable: ``CorruptPayload``, the payload cannot be decoded.
        """
        args, kwargs, _ = self.load_job(queue, job_id, task, payload, options)
        return args, kwargs

    def load_job(
        self,
        queue: str,
        job_id: str,
        task: str,
        payload: bytes,
        options: bytes,
        blob: bytes | None = None,
    ) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
        """A leased job's arguments and options, as a worker and the pull API read them: with
        signing on, nothing is decoded before payload and options are verified together
        (``blob``: its payload from the payload store, when its record holds a reference).

        Raises:
            BadSignature: signing is on and the payload or options are unsigned or forged.
            DecryptionFailed: it cannot be decrypted here (see ``_open_payload``).
            Unrunnable: ``CorruptPayload``, the payload or the options cannot be decoded;
                ``CompressionUnavailable``, ``DecompressionBomb``, ``MissingPayload``,
                ``TamperedPayload``: see ``decompress`` and ``_open_payload``.
        """
        # each layer's marker starts with a zero byte: without one, it is the serialised value
        if self.signer is not None or self.encrypter is not None or payload[:1] == b"\x00":
            opened = self._open_payload(queue, job_id, task, options, payload, blob)
            payload = self.decompress(opened)
        try:
            value = self.serializer.loads(payload)
            if (
                not isinstance(value, list | tuple)
                or not 2 <= len(value) <= 3
                or not isinstance(value[0], list | tuple)
                or not isinstance(value[1], dict)
            ):
                raise ValueError("payload is not an [args, kwargs] pair")
            if len(value) == 3:  # [args, kwargs, meta]: what a traced producer adds
                meta = value[2]
                parent = meta.get("traceparent") if isinstance(meta, dict) else None
                if isinstance(parent, str):
                    carried_trace.set(parent)
            return tuple(value[0]), value[1], self.load_options(options) if options else {}
        except Exception as exc:
            raise corrupt(exc) from exc

    # ------------------------------------------------------------------ options
    def dump_options(self, options: Mapping[str, Any]) -> bytes:
        return self.json.dumps(dict(options))

    def load_options(self, data: bytes) -> dict[str, Any]:
        if not data:
            return {}
        value = self.json.loads(data)
        if not isinstance(value, dict):
            raise ValueError("job options are not a JSON object")
        return value

    def member_options(self, batch_queue: str, batch_id: str) -> dict[str, Any]:
        """Options that record a sub-job's batch, so (signed with its payload) the worker can
        bind its result to that batch. Only when signing or encrypting: nothing reads them
        otherwise."""
        if self.signer is None and self.encrypter is None:
            return {}
        return {MEMBER_OPTION: [batch_queue, batch_id]}

    def result_ttl_ms(self, options: Mapping[str, Any], task_ttl: float | None = None) -> int:
        """Retention of a finished job: per-job option, else the task's, else the App's."""
        rt = options.get("result_ttl")
        if rt is None:
            rt = task_ttl
        if rt is None:
            return self.result_ttl_default_ms
        ms = int(float(rt) * 1000)
        return -1 if ms < 0 else ms  # a task's keep_result=True: for good

    # ------------------------------------------------------------------ outcomes
    def dump_result(
        self,
        value: Any,
        *,
        queue: str = "",
        job_id: str = "",
        task: str = "",
        options: Mapping[str, Any] | None = None,
    ) -> bytes:
        """The stored form of a job's result; with signing on, signed for the job (``queue``,
        ``job_id``, ``task``) and for the batch its verified ``options`` name, if any."""
        data = dumps_checked(self.serializer, value, 0, "the job's result")
        data = self.compressor.compress(data)
        return self._seal_result(queue, job_id, task, _member_of(options or {}), data)

    def _seal_result(
        self, queue: str, job_id: str, task: str, batch: tuple[str, str] | None, data: bytes
    ) -> bytes:
        if self.encrypter is not None:
            data = self.encrypter.seal_result(queue, job_id, task, batch, data)
        if self.signer is None:
            return data
        return self.signer.sign_result(queue, job_id, task, batch, data)

    def _open_result(self, queue: str, job_id: str, data: bytes) -> SignedResult | None:
        """A stored result's task, batch and serialised value, verified and decrypted (None:
        neither signing nor encryption is on, ``data`` is the value as it is)."""
        opened: SignedResult | None = None
        if self.signer is not None:
            opened = self.signer.verify_result(queue, job_id, data)
            data = opened.data
        elif data.startswith(FAMILY):
            raise BadSignature("the result is signed, but this App has no signing_key")
        if self.encrypter is not None:
            return self.encrypter.open_result(queue, job_id, data)
        if data.startswith(ENCRYPTED):
            raise DecryptionFailed("the result is encrypted, but this App has no encryption_key")
        return opened

    def load_result(
        self,
        data: bytes,
        *,
        queue: str = "",
        job_id: str = "",
        batch: tuple[str, str] | None = None,
    ) -> Any:
        """A job's result, as ``Job.result()`` and batch readers read it; with signing on,
        nothing is decoded before it is verified as the result of job ``job_id`` of ``queue``
        (and, given ``batch``, as made for that batch: home queue, batch id).

        Raises:
            BadSignature: signing is on and the result is unsigned, forged, another job's, or
                not made for ``batch``; or signing is off and the result is signed.
            DecryptionFailed: it cannot be decrypted here (with encryption on: not encrypted,
                another key, tampered or another job's; without: encrypted).
            CorruptRecord: it is compressed and cannot be inflated here (its codec is not
                installed, it would pass the cap, or it is not a valid frame).
        """
        opened = self._open_result(queue, job_id, data)
        if opened is not None:
            if batch is not None and (opened.batch_queue, opened.batch_id) != batch:
                raise BadSignature(
                    f"the result of job {job_id!r} was not made for batch {batch[1]!r} "
                    f"of queue {batch[0]!r}"
                )
            data = opened.data
        try:
            data = self.compressor.decompress(data)
        except CompressionError as exc:
            raise CorruptRecord(job_id, "result", f"{exc.kind}: {exc}") from None
        if not data:
            return None
        try:
            return self.serializer.loads(data)
        except RecursionError as exc:  # nested deeper than the decoder goes
            raise SerializationError(f"cannot read the result: {exc}") from exc

    def decompress(self, data: bytes) -> bytes:
        """A serialised value as it was before compression (as it is when not compressed).

        Raises:
            Unrunnable: ``CompressionUnavailable`` (its codec is not installed here),
                ``DecompressionBomb`` (it would inflate past the cap), ``CorruptPayload``.
        """
        try:
            return self.compressor.decompress(data)
        except CompressionError as exc:
            raise Unrunnable(exc.kind, str(exc)) from None

    async def fetch_blob(self, queue: str, job_id: str, payload: bytes) -> bytes | None:
        """The blob of a stored payload that holds a reference, from the payload store (None:
        no reference, no store here, or the store has no blob; ``load_job`` then says why).
        Read before the reference is verified, used only after."""
        if self.claim is None or not is_reference(carried(payload, False)):
            return None
        return await self.claim.fetch(queue, job_id)

    # ------------------------------------------------------------------ rekey
    def rekey_payload(
        self, queue: str, job_id: str, task: str, options: bytes, payload: bytes
    ) -> bytes | None:
        """A stored payload signed and encrypted again with the first keys, or None when it
        already is. Raises what ``load_job`` raises for a payload it cannot read."""
        data = self._open_payload(queue, job_id, task, options, payload)
        signer = self.signer
        if (
            signer is None
            or _verifies(signer.current().verify_payload, queue, job_id, task, options, payload)
        ) and self._encrypted_now(carried(payload, False)):
            return None
        return self._seal_payload(queue, job_id, task, options, data)

    def rekey_result(self, queue: str, job_id: str, data: bytes) -> bytes | None:
        """A stored result signed and encrypted again with the first keys, or None when it
        already is (or is neither signed nor encrypted). Raises what ``load_result`` does."""
        opened = self._open_result(queue, job_id, data)
        signer = self.signer
        if opened is None or (
            (signer is None or _verifies(signer.current().verify_result, queue, job_id, data))
            and self._encrypted_now(carried(data, True))
        ):
            return None
        batch = (opened.batch_queue, opened.batch_id) if opened.batch_id else None
        return self._seal_result(queue, job_id, opened.task, batch, opened.data)

    def _encrypted_now(self, inner: bytes) -> bool:
        """Whether a value inside its signature is encrypted with the first key (or encryption
        is off)."""
        return self.encrypter is None or self.encrypter.is_current(inner)

    def dump_error(self, error: BaseException | str, *, with_traceback: bool = True) -> bytes:
        """The stored form of a failure: JSON with type, message and traceback (none for an
        Unrunnable: its message says it all)."""
        if isinstance(error, BaseException):
            keep = with_traceback and not isinstance(error, Unrunnable)
            rec = {
                "type": error_type(error),
                "message": str(error),
                "traceback": "".join(tb.format_exception(error)) if keep else None,
            }
        else:
            rec = {"type": "Error", "message": str(error), "traceback": None}
        return self.json.dumps(rec)

    def load_error(self, data: bytes) -> ErrorInfo:
        try:
            rec = self.json.loads(data)
            return ErrorInfo(str(rec["type"]), str(rec["message"]), rec.get("traceback"))
        except Exception:
            return ErrorInfo("Unknown", data.decode(errors="replace"))


def _member_of(options: Mapping[str, Any]) -> tuple[str, str] | None:
    """The batch (home queue, id) a job's options say it belongs to, if any."""
    value = options.get(MEMBER_OPTION)
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return value[0], value[1]
    return None


def _verifies(verify: Callable[..., object], *args: Any) -> bool:
    """Whether ``verify(*args)`` passes (a signer's check, with its first key only)."""
    try:
        verify(*args)
    except BadSignature:
        return False
    return True


def check_size(data: bytes, limit: int, what: str) -> None:
    """Refuse ``data`` (serialised and compressed, as stored) over ``limit`` bytes (0: none)."""
    if limit and len(data) > limit:
        raise PayloadTooLarge(
            f"{what} take {len(data):,} bytes (serialised, compressed), over the limit of "
            f"{limit:,} (App(max_payload_bytes=...)); store large data elsewhere and pass a "
            "reference, or use App(payload_store=...)"
        )


def corrupt(exc: Exception) -> Unrunnable:
    """The reason a job whose stored record cannot be decoded is dead-lettered."""
    return Unrunnable("CorruptPayload", f"cannot decode: {exc!r}")
