"""The scripts as one server-side function library (``FUNCTION LOAD`` / ``FCALL``).

Run with EVALSHA, a script's whole source (the library parts it needs, then its own file)
runs on every call, defining every function of those parts again: 20-30 µs of the enqueue
script's ~50 µs on the server (docs/benchmarks.md, Round 2). In a function library that
prelude runs once, when the library is loaded; a call only runs the script's body.

The library is made from the same files, unchanged:

- the library parts come once, in ``LIB`` order, then each script's file as the body of a
  function (``local function main_<name>() ... end``), registered as ``<library>_<name>``;
- ``KEYS`` and ``ARGV`` are locals of the library that each call sets first, so the files
  read them as they do under EVALSHA;
- a part's top-level ``local X = <expr>`` whose value depends on the call (its expression
  names ``KEYS``, ``ARGV``, ``BASE``, a ``K_`` key, or ``cjson``/``redis``, which a library
  may not use while it loads) is declared at load and assigned at the start of every call,
  in the parts' order. Such a statement must fit on one line (tests/test_funclib.py runs
  every script through the library);
- so is one marked ``-- per call`` at the end of its line: state of one call (a cache, a
  buffer) that a library would otherwise carry from one call into the next, where EVALSHA
  starts each call afresh (tests/test_funclib.py checks that every top-level local a
  function assigns to is marked);
- but one whose expression names only ``BASE`` and ``cjson`` (a key made from the key base,
  a constant JSON text), and is not marked, is assigned again only when a call's ``BASE``
  differs from the last call's: its value depends on nothing else, and most calls of a
  server are for the queue of the call before (each such line cost a call about 1,000 server
  instructions, 12 of them 15% of a lone enqueue's).

The library's name carries a hash of its code (``aq_<16 hex>``), and so does each function's
name, so two releases of aioqueue use two libraries side by side on one server during a
rolling deploy; a library is never replaced, only added.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

_LOCAL = re.compile(r"^local ([A-Za-z_][\w, ]*?) = (.+)$")
#: the end of a part's top-level ``local`` line whose value is reset at the start of each call
PER_CALL_MARK = "-- per call"
_PER_CALL = re.compile(r"\b(KEYS|ARGV|BASE|K_\w+|cjson|redis)\b")
#: what makes such an expression depend on more than the key base (see above)
_NOT_PER_BASE = re.compile(r"\b(KEYS|ARGV|K_\w+|redis)\b")


def binding(line: str) -> str | None:
    """How the library binds a part's top-level line (see above): ``"call"``, assigned at the
    start of every call; ``"base"``, only when a call's key base is new; None, at load."""
    m = _LOCAL.match(line)
    if not m or not (_PER_CALL.search(m.group(2)) or line.endswith(PER_CALL_MARK)):
        return None
    if line.endswith(PER_CALL_MARK) or m.group(1) == "BASE" or _NOT_PER_BASE.search(m.group(2)):
        return "call"
    return "base"


class FunctionLibrary:
    """One function library holding every script: its name, its source and the name of
    each script's function."""

    __slots__ = ("functions", "name", "source")

    def __init__(self, parts: Sequence[str], scripts: Sequence[tuple[str, str]]) -> None:
        """``parts``: the library parts' sources in order; ``scripts``: (name, source)."""
        # the assignments made at the start of a call, in the parts' order: every call's, and
        # those made only for a new key base
        per_call: list[str] = []
        per_base: list[str] = []
        body = ["local KEYS, ARGV = {}, {''}", "local base__"]
        for part in parts:
            lines = []
            for line in part.splitlines():
                kind = binding(line)
                m = _LOCAL.match(line)
                if kind is None or m is None:
                    lines.append(line)
                    continue
                lines.append(f"local {m.group(1)}")
                own = per_call if kind == "call" else per_base
                own.append(f"{m.group(1)} = {m.group(2)}")
            body.append("\n".join(lines))
        body.append("local function bind__(keys, args)\n  KEYS, ARGV = keys, args")
        body += [f"  {line}" for line in per_call]
        body.append("  if BASE ~= base__ then")
        body += [f"    {line}" for line in [*per_base, "base__ = BASE"]]
        body += ["  end", "end"]
        for name, source in scripts:
            body.append(f"local function main__{name}()\n{source}\nend")
        code = "\n".join(body)
        self.name = "aq_" + hashlib.sha1(code.encode()).hexdigest()[:16]
        self.functions = {name: f"{self.name}_{name}" for name, _ in scripts}
        register = [
            f"redis.register_function('{self.functions[name]}', "
            f"function(keys, args) bind__(keys, args) return main__{name}() end)"
            for name, _ in scripts
        ]
        self.source = "\n".join([f"#!lua name={self.name}", code, *register, ""])


def function_missing(exc: Exception) -> bool:
    """The server does not know the function called (``FCALL``): load the library again."""
    return "function not found" in str(exc).lower()
