"""The command line's parser (``Parser``): an ArgumentParser whose usage errors are one line,
which keeps the options it is given (``options``, those of its argument groups included) and
its ``worker`` command's parser, so that the supervisor passes a worker's options on to the
workers it starts without reading argparse's internals."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from .load import EXIT_USAGE


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that keeps its options, and whose usage errors are one line
    (argparse prints the usage first)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: every option and positional added, in order (``--help`` is the first)
        self.options: list[argparse.Action] = []
        #: the ``worker`` command's parser, on the top-level parser
        self.worker: Parser | None = None
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"aioqueue: error: {message} (see {self.prog} --help)\n")

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.options.append(action)
        return action

    def option_group(self, title: str) -> _Group:
        """An argument group (its options under ``title`` in ``--help``) whose options this
        parser keeps too (argparse's ``add_argument_group`` is left as it is: the parser
        itself makes its groups with it)."""
        return _Group(self, self.add_argument_group(title))


class _Group:
    """An argument group of a ``Parser``: what it adds is the parser's option as well."""

    __slots__ = ("group", "parser")

    def __init__(self, parser: Parser, group: Any) -> None:
        self.parser = parser
        self.group = group

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action: argparse.Action = self.group.add_argument(*args, **kwargs)
        self.parser.options.append(action)
        return action


__all__ = ["Parser"]
