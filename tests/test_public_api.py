"""The public API is an explicit, sorted list, and nothing else looks public."""

from __future__ import annotations

import importlib.metadata
import inspect
import re
from types import ModuleType

import aioqueue


def public_names() -> set[str]:
    """Names the package shows: not private, not a submodule, not ``annotations``."""
    return {
        name
        for name, value in vars(aioqueue).items()
        if not name.startswith("_") and not isinstance(value, ModuleType) and name != "annotations"
    }


def test_all_is_sorted_and_lists_exactly_the_public_names() -> None:
    assert aioqueue.__all__ == sorted(aioqueue.__all__)
    assert len(set(aioqueue.__all__)) == len(aioqueue.__all__)
    assert set(aioqueue.__all__) - {"__version__"} == public_names()
    assert "__version__" in aioqueue.__all__


def test_star_import_gives_the_public_names() -> None:
    namespace: dict[str, object] = {}
    exec("from aioqueue import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(aioqueue.__all__)


def test_public_objects_come_from_the_package() -> None:
    for name in public_names():
        module = getattr(getattr(aioqueue, name), "__module__", "aioqueue")
        assert module.startswith("aioqueue"), f"{name} comes from {module}"


def test_version_is_a_string_and_matches_the_installed_metadata() -> None:
    assert isinstance(aioqueue.__version__, str)
    assert re.fullmatch(r"\d+\.\d+\.\d+([.-]?\w+)*", aioqueue.__version__)
    assert importlib.metadata.version("aioqueue") == aioqueue.__version__


def test_every_exported_exception_but_retry_is_an_aioqueue_error() -> None:
    exceptions = {
        name: value
        for name in public_names()
        if isinstance(value := getattr(aioqueue, name), type) and issubclass(value, BaseException)
    }
    assert "AioQueueError" in exceptions
    for name, exc in exceptions.items():
        if name == "Retry":  # a signal a job raises, not an error aioqueue raises
            assert not issubclass(exc, aioqueue.AioQueueError)
        else:
            assert issubclass(exc, aioqueue.AioQueueError), name
    assert issubclass(aioqueue.ConnectionError, OSError)
    assert issubclass(aioqueue.ResultTimeout, TimeoutError)
    assert issubclass(aioqueue.PayloadTooLarge, aioqueue.SerializationError)


def test_the_testing_kit_lists_its_public_names() -> None:
    import aioqueue.testing as testing

    assert testing.__all__ == sorted(testing.__all__)
    namespace: dict[str, object] = {}
    exec("from aioqueue.testing import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(testing.__all__)
    for name in testing.__all__:
        value = getattr(testing, name)
        if isinstance(value, type) or inspect.isfunction(value):
            assert value.__module__ == "aioqueue.testing", name  # defined there, not imported
    assert {"RunSummary", "run_until_empty", "unique_prefix"} <= set(testing.__all__)
