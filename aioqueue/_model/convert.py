"""Typed arguments and results: values read back from JSON, turned into what a task's type
hints ask for.

JSON has strings, numbers, booleans, null, lists and objects. The JSON serializer writes
dataclasses as objects, ``datetime``/``date``/``time`` in ISO 8601, ``UUID`` and ``Decimal``
as strings, an ``Enum`` as its value and a Pydantic model as its JSON form (see
``_serialize.py``); this module reads them back, led by the annotations of the task's
function: a worker decodes each argument by its parameter's annotation, ``Job.result()`` its
result by the return annotation.

A converter is built once per annotation (cached) and once per task, never per job. An
annotation that JSON already answers (``str``, ``int``, ``float``, ``bool``, ``None``,
``Any``, bare or plain ``list``/``dict``, a class it does not know) has no converter at all:
a task whose annotations are all of that kind decodes exactly as before, at no cost.
"""

from __future__ import annotations

import collections.abc as abc
import dataclasses
import enum
import inspect
import logging
import sys
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from datetime import date, datetime, time
from decimal import Decimal
from typing import Annotated, Any, Literal, Union, get_args, get_origin

logger = logging.getLogger(__name__)

#: a value as JSON gives it -> the value the annotation asks for
Convert = Callable[[Any], Any]

_PLAIN: frozenset[Any] = frozenset(
    {Any, object, str, int, float, bool, bytes, type(None), None, list, dict}
)
_SEQUENCES = frozenset({list, abc.Sequence, abc.MutableSequence, abc.Iterable, abc.Collection})
_MAPPINGS = frozenset({dict, abc.Mapping, abc.MutableMapping})
_CACHE_MAX = 4096
_cache: dict[Any, Convert | None] = {}


class ConversionError(ValueError):
    """A value that does not fit its annotation (raised by converters and decoders)."""


def converter(tp: Any) -> Convert | None:
    """The converter for annotation ``tp``, or None when the JSON value is already right."""
    try:
        return _cache[tp]
    except KeyError:
        pass
    except TypeError:  # an unhashable annotation (Annotated with odd metadata): build each time
        return _build(tp)
    conv = _build(tp)
    if len(_cache) >= _CACHE_MAX:  # annotations made at run time: do not grow without bound
        _cache.clear()
    _cache[tp] = conv
    return conv


def _build(tp: Any) -> Convert | None:
    try:
        if tp in _PLAIN:
            return None
    except TypeError:  # unhashable: not one of them
        pass
    if isinstance(tp, typing.TypeVar | str):
        return None
    if isinstance(tp, typing.NewType):
        return converter(tp.__supertype__)
    origin = get_origin(tp)
    if origin is not None:
        return _generic(tp, origin, get_args(tp))
    if not isinstance(tp, type):
        return None
    if issubclass(tp, enum.Enum):
        return _enum(tp)
    for kind, parse in _SCALARS:
        if issubclass(tp, kind):
            return parse if tp is kind else None  # a subclass: left as JSON gives it
    if dataclasses.is_dataclass(tp):
        return _Dataclass(tp)
    if _is_pydantic(tp):
        return _pydantic(tp)
    return None


def _generic(tp: Any, origin: Any, args: tuple[Any, ...]) -> Convert | None:
    if origin is Annotated:
        return converter(args[0])
    if origin is Literal:
        return None
    if origin is Union or origin is types.UnionType:
        return _union(tp, args)
    if origin is tuple:
        return _tuple(args)
    if origin in _SEQUENCES:
        item = converter(args[0]) if args else None
        if item is None:
            return None
        return lambda v: [item(x) for x in _checked(v, list, tp)]
    if origin in _MAPPINGS and len(args) == 2:
        key, value = converter(args[0]), converter(args[1])
        if key is None and value is None:
            return None
        k = key or _same
        val = value or _same
        return lambda v: {k(a): val(b) for a, b in _checked(v, dict, tp).items()}
    return None


def _same(value: Any) -> Any:
    return value


def _checked(value: Any, kind: type | tuple[type, ...], tp: Any) -> Any:
    if not isinstance(value, kind):
        what = "list" if kind == _ARRAY else getattr(kind, "__name__", "value")
        raise ConversionError(f"expected a JSON {what} for {_name(tp)}, got {value!r:.80}")
    return value


_ARRAY = (list, tuple)  # a JSON array (a tuple when a caller passes Python values)


def _tuple(args: tuple[Any, ...]) -> Convert:
    if len(args) == 2 and args[1] is Ellipsis:
        item = converter(args[0]) or _same
        return lambda v: tuple(item(x) for x in _checked(v, _ARRAY, tuple))
    if args == ((),):  # tuple[()]
        return lambda v: tuple(_checked(v, _ARRAY, tuple))
    items = [converter(a) or _same for a in args] if args else None

    def convert(v: Any) -> tuple[Any, ...]:
        _checked(v, _ARRAY, tuple)
        if items is None:
            return tuple(v)
        if len(v) != len(items):
            raise ConversionError(f"expected {len(items)} items, got {len(v)}")
        return tuple(c(x) for c, x in zip(items, v, strict=True))

    return convert


def _union(tp: Any, args: tuple[Any, ...]) -> Convert | None:
    optional = type(None) in args
    members = [a for a in args if a is not type(None)]
    convs = [(m, converter(m)) for m in members]
    if all(c is None for _, c in convs):
        return None
    if len(convs) == 1:  # X | None: the common case
        one = convs[0][1]
        assert one is not None
        return lambda v: None if v is None else one(v)

    def convert(v: Any) -> Any:
        if v is None and optional:
            return None
        for member, c in convs:  # the first member that takes it, in the annotation's order
            if c is None:
                if _plain_fits(member, v):
                    return v
                continue
            try:
                return c(v)
            except Exception:
                continue
        raise ConversionError(f"{v!r:.80} fits none of {_name(tp)}")

    return convert


def _plain_fits(member: Any, value: Any) -> bool:
    kind = get_origin(member) or member
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(kind, type) and kind is not object:
        return isinstance(value, kind)
    return True


def _enum(tp: type[enum.Enum]) -> Convert:
    def convert(v: Any) -> Any:
        return v if isinstance(v, tp) else tp(v)

    return convert


def _parser(kind: type, parse: Callable[[str], Any]) -> Convert:
    def convert(v: Any) -> Any:
        if isinstance(v, kind):
            return v
        if not isinstance(v, str):
            raise ConversionError(f"expected a string for {kind.__name__}, got {v!r:.80}")
        return parse(v)

    return convert


def _decimal(v: Any) -> Decimal:
    if isinstance(v, Decimal):
        return v
    if isinstance(v, str | int) and not isinstance(v, bool):
        return Decimal(v)
    if isinstance(v, float):  # a number a producer wrote by hand: its shortest repr
        return Decimal(repr(v))
    raise ConversionError(f"expected a string or number for Decimal, got {v!r:.80}")


#: (class, converter), most specific first: a datetime is also a date
_SCALARS: tuple[tuple[type, Convert], ...] = (
    (datetime, _parser(datetime, datetime.fromisoformat)),
    (date, _parser(date, date.fromisoformat)),
    (time, _parser(time, time.fromisoformat)),
    (uuid.UUID, _parser(uuid.UUID, uuid.UUID)),
    (Decimal, _decimal),
)


class _Dataclass:
    """A dataclass from a JSON object, its fields converted by their annotations (resolved on
    first use, so a dataclass may name itself or classes defined after it)."""

    __slots__ = ("cls", "fields")

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.fields: dict[str, Convert | None] | None = None

    def _resolve(self) -> dict[str, Convert | None]:
        hints = _hints(self.cls, self.cls.__qualname__)
        fields = {
            f.name: converter(hints.get(f.name, Any))
            for f in dataclasses.fields(self.cls)
            if f.init
        }
        self.fields = fields
        return fields

    def __call__(self, v: Any) -> Any:
        if isinstance(v, self.cls):
            return v
        fields = self.fields if self.fields is not None else self._resolve()
        data = _checked(v, dict, self.cls)
        kwargs = {}
        for key, value in data.items():
            if key not in fields:
                continue  # a key the class does not take (an older version's field)
            c = fields[key]
            kwargs[key] = value if c is None else c(value)
        return self.cls(**kwargs)


def _is_pydantic(tp: type) -> bool:
    pydantic = sys.modules.get("pydantic")  # only if the application uses it
    return pydantic is not None and issubclass(tp, pydantic.BaseModel)


def _pydantic(tp: Any) -> Convert:
    def convert(v: Any) -> Any:
        return v if isinstance(v, tp) else tp.model_validate(v)

    return convert


def _name(tp: Any) -> str:
    return getattr(tp, "__qualname__", None) or repr(tp)


def _hints(obj: Any, what: str) -> dict[str, Any]:
    """``obj``'s resolved type hints; none (values as JSON gives them) if they cannot be
    resolved, with a warning that says why."""
    try:
        return typing.get_type_hints(obj, include_extras=True)
    except Exception as exc:
        logger.warning(
            "cannot resolve the type hints of %s (%r): its values are passed as JSON gives them",
            what,
            exc,
        )
        return {}


class ArgsDecoder:
    """Converts a job's decoded ``(args, kwargs)`` by the annotations of its task function."""

    __slots__ = ("by_name", "positional", "var_kw", "var_pos")

    def __init__(
        self,
        positional: list[tuple[str, Convert | None]],
        by_name: dict[str, Convert | None],
        var_pos: Convert | None,
        var_kw: Convert | None,
    ) -> None:
        self.positional = positional
        self.by_name = by_name
        self.var_pos = var_pos
        self.var_kw = var_kw

    def __call__(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        out_args = []
        for i, value in enumerate(args):
            if i < len(self.positional):
                name, c = self.positional[i]
            else:
                name, c = f"*args[{i - len(self.positional)}]", self.var_pos
            out_args.append(value if c is None else _apply(c, name, value))
        out_kwargs = {}
        for name, value in kwargs.items():
            c = self.by_name.get(name, self.var_kw)
            out_kwargs[name] = value if c is None else _apply(c, name, value)
        return tuple(out_args), out_kwargs


def _apply(c: Convert, name: str, value: Any) -> Any:
    try:
        return c(value)
    except Exception as exc:
        raise ConversionError(f"argument {name!r}: cannot read {value!r:.80}: {exc}") from exc


def task_types(fn: Callable[..., Any], what: str) -> tuple[ArgsDecoder | None, Convert | None]:
    """The argument decoder and the result converter of task function ``fn`` (None each when
    its annotations need none)."""
    hints = _hints(fn, what)
    if not hints:
        return None, None
    kinds = inspect.Parameter
    positional: list[tuple[str, Convert | None]] = []
    by_name: dict[str, Convert | None] = {}
    var_pos = var_kw = None
    for p in inspect.signature(fn).parameters.values():
        c = converter(hints.get(p.name, Any))
        if p.kind is kinds.VAR_POSITIONAL:
            var_pos = c
        elif p.kind is kinds.VAR_KEYWORD:
            var_kw = c
        else:
            if p.kind is not kinds.KEYWORD_ONLY:
                positional.append((p.name, c))
            if p.kind is not kinds.POSITIONAL_ONLY:
                by_name[p.name] = c
    needed = (
        var_pos is not None
        or var_kw is not None
        or any(c is not None for _, c in positional)
        or any(c is not None for c in by_name.values())
    )
    decoder = ArgsDecoder(positional, by_name, var_pos, var_kw) if needed else None
    returns = hints.get("return", Any)
    if get_origin(returns) is abc.Coroutine or returns is abc.Coroutine:  # -> Coroutine[.., R]
        returns = (get_args(returns) or (Any, Any, Any))[-1]
    return decoder, converter(returns)
