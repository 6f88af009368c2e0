"""A task's call signature, checked at enqueue (``Signature``): a misuse fails in the caller,
not later in a worker."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any


class Signature:
    """A fast check that call arguments fit a function, so a misuse fails at enqueue."""

    __slots__ = (
        "allowed",
        "least",
        "name",
        "npos",
        "positional",
        "posonly",
        "required",
        "var_kw",
        "var_pos",
    )

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        params = list(inspect.signature(fn).parameters.values())
        kinds = inspect.Parameter
        self.name = name
        self.positional = [
            p.name for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        ]
        self.npos = len(self.positional)
        self.posonly = frozenset(p.name for p in params if p.kind is kinds.POSITIONAL_ONLY)
        self.var_pos = any(p.kind is kinds.VAR_POSITIONAL for p in params)
        self.var_kw = any(p.kind is kinds.VAR_KEYWORD for p in params)
        self.allowed = frozenset(
            p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
        )
        self.required = [
            (p.name, p.kind is kinds.KEYWORD_ONLY)
            for p in params
            if p.default is p.empty and p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)
        ]
        #: a call with positional arguments only fits when it gives at least this many (the
        #: required positional parameters come first) and at most npos (any with var_pos);
        #: -1 when it never fits (a keyword-only parameter is required)
        self.least = -1 if any(kwonly for _, kwonly in self.required) else len(self.required)

    def check(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        if not kwargs and 0 <= self.least <= len(args) and (len(args) <= self.npos or self.var_pos):
            return  # positional arguments only, as many as fit (the common call)
        if len(args) > self.npos and not self.var_pos:
            raise TypeError(
                f"{self.name}() takes {self.npos} positional arguments, got {len(args)}"
            )
        given = self.positional[: len(args)]
        for key in kwargs:
            if key in given and key not in self.posonly:
                raise TypeError(f"{self.name}() got multiple values for argument {key!r}")
            if key not in self.allowed and not self.var_kw:
                raise TypeError(f"{self.name}() got an unexpected keyword argument {key!r}")
        for name, kwonly in self.required:
            by_keyword = name in kwargs and name not in self.posonly
            if not by_keyword and (kwonly or name not in given):
                raise TypeError(f"{self.name}() missing required argument {name!r}")
