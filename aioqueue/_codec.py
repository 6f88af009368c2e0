"""The codec: how a job's arguments, options, result and errors are stored, and read back.

One place for every (de)serialisation of a job record, used alike by the producer (enqueue),
the worker and the pull API, so a corrupt value is judged the same way wherever it is read.
"""

from __future__ import annotations

import traceback as tb
from collections.abc import Mapping
from typing import Any

from ._exceptions import BadSignature
from ._job import ErrorInfo
from ._serialize import JsonSerializer, Serializer, dumps_checked
from ._signing import Signer


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
        max_payload_bytes: refuse arguments that serialise to more (0: no limit).
        result_ttl_ms: the App's retention of finished jobs (-1: forever).
    """

    __slots__ = ("json", "max_payload_bytes", "result_ttl_default_ms", "serializer", "signer")

    def __init__(
        self,
        serializer: Serializer,
        signer: Signer | None,
        max_payload_bytes: int,
        result_ttl_ms: int,
    ) -> None:
        self.serializer = serializer
        self.json: Serializer = JsonSerializer()
        self.signer = signer
        self.max_payload_bytes = max_payload_bytes
        self.result_ttl_default_ms = result_ttl_ms

    # ------------------------------------------------------------------ arguments
    def dump_args(
        self, job_id: str, task: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> bytes:
        """The stored payload of a job: its serialised arguments, signed if configured."""
        data = dumps_checked(
            self.serializer, [list(args), dict(kwargs)], self.max_payload_bytes, "job arguments"
        )
        return data if self.signer is None else self.signer.sign(job_id, task, data)

    def load_args(
        self, job_id: str, task: str, payload: bytes
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """A job's arguments from its stored payload (checking its signature if configured).

        Raises:
            BadSignature: signing is on and the payload is unsigned or forged.
            Unrunnable: ``CorruptPayload``, the payload cannot be decoded.
        """
        args, kwargs, _ = self.load_job(job_id, task, payload, b"")
        return args, kwargs

    def load_job(
        self, job_id: str, task: str, payload: bytes, options: bytes
    ) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
        """A leased job's arguments and options, as a worker and the pull API read them.

        Raises:
            BadSignature: signing is on and the payload is unsigned or forged.
            Unrunnable: ``CorruptPayload``, the payload or the options cannot be decoded.
        """
        try:
            if self.signer is not None:
                payload = self.signer.verify(job_id, task, payload)
            value = self.serializer.loads(payload)
            if (
                not isinstance(value, list | tuple)
                or len(value) != 2
                or not isinstance(value[0], list | tuple)
                or not isinstance(value[1], dict)
            ):
                raise ValueError("payload is not an [args, kwargs] pair")
            return tuple(value[0]), value[1], self.load_options(options) if options else {}
        except BadSignature:
            raise
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
    def dump_result(self, value: Any) -> bytes:
        return dumps_checked(self.serializer, value, 0, "the job's result")

    def load_result(self, data: bytes) -> Any:
        return self.serializer.loads(data) if data else None

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


def corrupt(exc: Exception) -> Unrunnable:
    """The reason a job whose stored record cannot be decoded is dead-lettered."""
    return Unrunnable("CorruptPayload", f"cannot decode: {exc!r}")
