"""Wire-level packing of script calls: the one place that depends on redis-py internals.

A script call's start (``FCALL <function> <numkeys> <keys...> <key base>``, or ``EVALSHA
<sha> ...`` on a server without functions) is the same for every call of one script on one
queue. ``Head`` carries it packed once; connections of the class that
``use_fast_packing`` installs splice it in, so a call only encodes its varying arguments.

It relies on two redis-py internals, checked by tests/test_wire.py: a pool's
``connection_class`` attribute (the class its new connections are made of) and the connections'
``pack_command(*args) -> list[bytes]`` method. The held connections' wire (``_hot._Wire``)
relies on two more, checked by tests/test_hot.py: a connected connection's stream writer
(``_writer``, whose transport is taken over) and its parser (``_parser``, whose hiredis
settings the wire's reader copies); ``FastPack`` reads them for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, TypeVar, cast

import redis.asyncio as aioredis
from redis.exceptions import InvalidResponse

from .clock import virtual_clock_on

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:  # redis[hiredis], a core dependency; without it, the arguments are packed here
    from hiredis import pack_command as _hiredis_pack
    from redis._parsers import _AsyncHiredisParser
except ImportError:  # pragma: no cover
    _hiredis_pack = None
    _AsyncHiredisParser = None  # type: ignore[assignment,misc]


def _bulk(arg: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(arg), arg)


class Head(str):
    """The command name (``FCALL`` or ``EVALSHA``) carrying the packed, unchanging start of a
    script call: the function name (or SHA), the KEYS and the key base (ARGV[1]). A
    connection of the fast class sends it as is, so a call only encodes its varying
    arguments."""

    packed: bytes
    nargs: int

    def __new__(cls, command: str, target: str, keys: Sequence[str], base: str) -> Head:
        head = super().__new__(cls, command)
        fixed = [command.encode(), target.encode(), b"%d" % len(keys)]
        fixed += [k.encode() for k in keys]
        fixed.append(base.encode())
        head.packed = b"".join(_bulk(a) for a in fixed)
        head.nargs = len(fixed)
        return head


_HEADS: dict[tuple[str, str, tuple[str, ...], str], Head] = {}


def head_for(command: str, target: str, keys: Sequence[str], base: str) -> Head:
    key = (command, target, tuple(keys), base)
    head = _HEADS.get(key)
    if head is None:
        if len(_HEADS) > 10_000:  # many queues come and go: do not grow without bound
            _HEADS.clear()
        head = _HEADS[key] = Head(command, target, keys, base)
    return head


class FastPack:
    """Mixin for redis-py connections: packs a script call that starts with a Head by
    splicing in its pre-packed bytes; every other command is packed by redis-py. It also
    hands a held connection's wire (``_hot._Wire``) what it needs of redis-py's internals."""

    encoder: Any
    _parser: Any
    _writer: Any

    def reads_with_hiredis(self) -> bool:
        """Its replies are parsed by hiredis (redis-py's parser for it): a wire can read them."""
        return _AsyncHiredisParser is not None and isinstance(self._parser, _AsyncHiredisParser)

    def wire_transport(self) -> Any:
        """The transport of its stream (connected)."""
        return self._writer.transport

    def reader_options(self) -> dict[str, Any]:
        """The options of a hiredis ``Reader`` that parses its replies as its parser does
        (error replies as redis-py's exceptions, decoded as it decodes)."""
        options: dict[str, Any] = {
            "protocolError": InvalidResponse,
            "replyError": self._parser.parse_error,
        }
        if self.encoder.decode_responses:
            options["encoding"] = self.encoder.encoding
            options["errors"] = self.encoder.encoding_errors
        return options

    def pack_command(self, *args: Any) -> list[bytes]:
        head = args[0]
        if type(head) is not Head:
            return super().pack_command(*args)  # type: ignore[misc,no-any-return]
        count = b"*%d\r\n" % (head.nargs + len(args) - 1)
        rest = args[1:]
        if _hiredis_pack is not None and _PLAIN.issuperset(map(type, rest)):
            # hiredis packs them (C); its own count is left out, the head's goes first
            body = _hiredis_pack(rest)
            start = body.index(b"\n") + 1
            if len(body) < 65536:
                return [count + head.packed + body[start:]]
            # (a large one is not copied: redis-py writes a memoryview as it is)
            return [count + head.packed, memoryview(body)[start:]]  # type: ignore[list-item]
        parts: list[bytes] = [count, head.packed]
        put = parts.append
        for arg in rest:
            kind = type(arg)
            if kind is str:
                data = arg.encode()
            elif kind is bytes:
                data = arg
            elif kind is int:
                data = b"%d" % arg
            else:
                data = self.encoder.encode(arg)
            if len(data) < 4096:
                put(_bulk(data))
            else:  # (not copied twice)
                put(b"$%d\r\n" % len(data))
                put(data)
                put(b"\r\n")
        return [b"".join(parts)]


#: the argument types hiredis packs as redis-py's encoder does (UTF-8 text, bytes, decimal
#: integers; bool is no int here, and floats are written by the encoder)
_PLAIN: Final = frozenset({str, bytes, int})

_FAST: dict[type, type] = {}


def use_fast_packing(client: aioredis.Redis, timeout: float | None = None) -> None:
    """Make the client's pool create connections that splice pre-packed script heads, and
    give aioqueue's calls on it a time limit (``timeout`` seconds, see ``call_timeout``).
    A cluster client (no one pool: redis-py reads a script call's keys to route it) only
    gets the time limit."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        client.aioqueue_timeout = timeout  # type: ignore[attr-defined]
        return
    pool.aioqueue_timeout = timeout
    base = pool.connection_class
    if issubclass(base, FastPack):
        return
    fast = _FAST.get(base)
    if fast is None:
        fast = _FAST[base] = type(f"Fast{base.__name__}", (FastPack, base), {})
    pool.connection_class = fast


def call_timeout(client: aioredis.Redis) -> float | None:
    """The time limit of one of aioqueue's calls on this client (the App's socket_timeout)."""
    return getattr(getattr(client, "connection_pool", client), "aioqueue_timeout", None)


class ScriptName(Protocol):
    """What a script call is addressed by: its function in the library, or its SHA1."""

    @property
    def sha(self) -> str: ...
    @property
    def function(self) -> str: ...
    @property
    def test(self) -> ScriptName: ...


S = TypeVar("S", bound=ScriptName)


def build_of(client: Any, script: S) -> S:
    """The build of ``script`` that ``client`` runs: its test build (``script.test``) on a
    client in test mode (see _store/clock.py), else itself."""
    return cast(S, script.test) if virtual_clock_on(client) else script


def use_functions(client: Any, on: bool) -> None:
    """Record on the client's pool whether its server runs aioqueue's function library
    (then calls are ``FCALL``s), set once the library is loaded (``load_scripts``)."""
    client.connection_pool.aioqueue_functions = on


def functions_on(client: Any) -> bool:
    """Whether script calls on this client are ``FCALL``s (else ``EVALSHA``s)."""
    pool = getattr(client, "connection_pool", None)  # None: a cluster client (EVALSHA)
    return bool(getattr(pool, "aioqueue_functions", False))


def evalsha_command(
    client: Any, script: ScriptName, keys: Sequence[str], args: Sequence[Any]
) -> tuple[Any, ...]:
    """The arguments of ``execute_command`` for a script call (``args[0]``: the key base):
    an ``FCALL`` of its function where the library is loaded, else an ``EVALSHA`` (always on
    a cluster client, whose scripts are loaded on every primary with SCRIPT LOAD)."""
    pool = getattr(client, "connection_pool", None)  # None: a cluster client
    script = build_of(client, script)
    if pool is not None and getattr(pool, "aioqueue_functions", False):
        command, target = "FCALL", script.function
    else:
        command, target = "EVALSHA", script.sha
    if pool is not None and issubclass(pool.connection_class, FastPack):
        return (head_for(command, target, keys, args[0]), *args[1:])
    return (command, target, len(keys), *keys, *args)
