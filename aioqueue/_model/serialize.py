"""Serialisers for job arguments and results: JSON by default, pickle only on explicit opt-in.

A pickle payload is code execution for anyone who can write to Redis, so it is never the default
and never chosen implicitly.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import pickle
import sys
import uuid
from datetime import date, time
from decimal import Decimal
from typing import Any, Protocol, runtime_checkable

from .exceptions import ConfigurationError, PayloadTooLarge, SerializationError

_orjson: Any
try:  # orjson is optional: several times faster, same wire format
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised only without the extra
    _orjson = None


@runtime_checkable
class Serializer(Protocol):
    """Turns values into bytes and back. ``dumps`` raises ``TypeError``/``ValueError`` on
    values it cannot encode; ``loads`` raises any exception on bad input."""

    name: str

    def dumps(self, value: Any) -> bytes:
        """``value`` as bytes; raise ``TypeError`` or ``ValueError`` for what it cannot hold."""
        ...

    def loads(self, data: bytes) -> Any:
        """The value ``dumps`` made ``data`` from."""
        ...


def _has_nonfinite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list | tuple):
        return any(_has_nonfinite(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nonfinite(v) for v in value.values())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(_has_nonfinite(getattr(value, f.name)) for f in dataclasses.fields(value))
    if _is_model(value):
        return _has_nonfinite(value.model_dump())
    return False


def _is_model(value: Any) -> bool:
    """A Pydantic model (pydantic is never imported here: only if the application did)."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(value, pydantic.BaseModel)


def encode_extra(value: Any) -> Any:
    """What JSON stores for a value orjson has no form of its own for: a ``Decimal`` as its
    exact string, a Pydantic model as its JSON form (read back by the task's annotations,
    ``_convert.py``). Anything else: TypeError."""
    if isinstance(value, Decimal):
        return str(value)
    if _is_model(value):
        return value.model_dump(mode="json")
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def _encode_stdlib(value: Any) -> Any:
    """``encode_extra`` for the json module, which also lacks what orjson writes natively:
    the same forms, so either encoder writes the same JSON."""
    if isinstance(value, date | time):  # a datetime is a date
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # as orjson does: the fields passed to the class (not those with init=False)
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
    return encode_extra(value)


# str, int, dict and list subclasses (other than enums) are refused: orjson would write them
# as their base type, and they would come back as it
_ORJSON_OPTIONS = 0 if _orjson is None else _orjson.OPT_PASSTHROUGH_SUBCLASS


class JsonSerializer:
    """JSON (orjson when installed). Tuples become lists; dict keys must be strings; NaN,
    infinities, sets and bytes are refused. Dataclasses, ``datetime``, ``date``, ``time``,
    ``UUID``, ``Decimal``, ``Enum`` members and Pydantic models are written in their JSON
    form (objects, ISO 8601 and exact strings, values), which a task's type hints read back
    (``_convert.py``); without hints they arrive in that form."""

    name = "json"

    def dumps(self, value: Any) -> bytes:
        """``value`` as JSON (orjson where installed, else the standard library)."""
        if _orjson is not None:
            # copied into a right-sized object: orjson's own result sits in a buffer of a page
            # or more, so keeping many of them (enqueue_many, batches) costs a fresh page each
            data = memoryview(
                _orjson.dumps(value, default=encode_extra, option=_ORJSON_OPTIONS)
            ).tobytes()
            # orjson writes NaN and infinities as null: refuse them as the json module does
            if value is not None and b"null" in data and _has_nonfinite(value):
                raise ValueError("Out of range float values are not JSON compliant")
            return data
        return json.dumps(
            value, separators=(",", ":"), allow_nan=False, default=_encode_stdlib
        ).encode()

    def loads(self, data: bytes) -> Any:
        """The value of the JSON document ``data``."""
        if _orjson is not None:
            return _orjson.loads(data)
        return json.loads(data)


class PickleSerializer:
    """pickle: any picklable value. Only safe when nobody untrusted can write to Redis."""

    name = "pickle"

    def dumps(self, value: Any) -> bytes:
        """``value`` pickled with the highest protocol."""
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def loads(self, data: bytes) -> Any:
        """The unpickled value: runs whatever code ``data`` names (see the class docstring)."""
        return pickle.loads(data)


def get_serializer(spec: str | Serializer) -> Serializer:
    """Resolve ``"json"``, ``"pickle"`` or a Serializer object."""
    if isinstance(spec, str):
        if spec == "json":
            return JsonSerializer()
        if spec == "pickle":
            return PickleSerializer()
        raise ConfigurationError(f"unknown serializer {spec!r}: use 'json', 'pickle' or an object")
    if isinstance(spec, Serializer):
        return spec
    raise ConfigurationError(f"serializer must be 'json', 'pickle' or a Serializer, not {spec!r}")


def dumps_checked(serializer: Serializer, value: Any, limit: int, what: str) -> bytes:
    """Serialise ``value``, turning encoder errors into SerializationError and refusing
    payloads over ``limit`` bytes (0 = no limit)."""
    try:
        data = serializer.dumps(value)
    except (
        TypeError,
        ValueError,
        OverflowError,
        pickle.PicklingError,
        AttributeError,
        RecursionError,  # a value nested deeper than the encoder goes
    ) as exc:
        raise SerializationError(
            f"cannot serialise {what} with the {serializer.name} serializer: {exc}"
        ) from exc
    if limit and len(data) > limit:
        raise PayloadTooLarge(
            f"{what} serialise to {len(data):,} bytes, over the limit of {limit:,} "
            "(App(max_payload_bytes=...)); store large data elsewhere and pass a reference"
        )
    return data
