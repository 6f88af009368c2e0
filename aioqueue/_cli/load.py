"""Loading the user's App module for the command line (``worker module:app``, ``rekey``),
and the one-line error every command prints (``aioqueue: error: ...``)."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import NoReturn

from .._app.app import App
from .format import error

__all__ = ["EXIT_ERROR", "EXIT_OK", "EXIT_USAGE", "load_app"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


def load_app(target: str) -> App:
    """Import ``module:attribute`` (or ``module.attribute``) and return the App it names.

    Raises:
        SystemExit(1) with a clear message for an import error, a missing attribute, or an
        object that is not an App.
    """
    if ":" in target:
        module_name, _, attr = target.partition(":")
    else:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        _die(f"expected module:app (e.g. myproject.jobs:app), got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            _die(f"cannot import module {module_name!r}: {exc}")  # the module itself
        _die_in_user_code(module_name, exc)
    except Exception as exc:
        _die_in_user_code(module_name, exc)
    if not hasattr(module, attr):
        _die(f"module {module_name!r} has no attribute {attr!r}")
    obj = getattr(module, attr)
    if not isinstance(obj, App):
        _die(f"{target!r} is a {type(obj).__name__}, not an aioqueue.App")
    return obj


def _die_in_user_code(module_name: str, exc: BaseException) -> NoReturn:
    """Exit on an error raised while the user's module was imported: one line, then the
    frames of the user's own code (not importlib's, not aioqueue's)."""
    skipped = (
        "<frozen",
        os.path.dirname(os.path.dirname(__file__)),
        os.path.dirname(importlib.__file__),
    )
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(skipped)
    ]
    error(f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}")
    if frames:
        sys.stderr.write("".join(traceback.format_list(frames)))
    sys.stderr.write("".join(traceback.format_exception_only(exc)))
    raise SystemExit(EXIT_ERROR)


def _die(message: str) -> NoReturn:
    error(message)
    raise SystemExit(EXIT_ERROR)
