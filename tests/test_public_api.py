"""The public API is an explicit, sorted list, and nothing else looks public."""

from __future__ import annotations

import importlib.metadata
import inspect
import pickle
import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from types import ModuleType

import pytest

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


def test_public_classes_and_functions_say_they_come_from_aioqueue() -> None:
    # as anyio does: users never see the private layout (reprs, tracebacks, pickles, docs)
    homed = []
    for name in public_names():
        value = getattr(aioqueue, name)
        if isinstance(value, type) or inspect.isfunction(value):
            assert value.__module__ == "aioqueue", f"{name}.__module__ is {value.__module__}"
            assert value.__qualname__ == name
            homed.append(name)
    assert {"App", "Worker", "Queue", "AioQueueError", "current_job"} <= set(homed)
    assert "aioqueue._" not in repr(aioqueue.App)


def test_public_classes_and_errors_pickle_by_their_public_path() -> None:
    for name in public_names():
        value = getattr(aioqueue, name)
        if isinstance(value, type) or inspect.isfunction(value):
            data = pickle.dumps(value)
            assert b"aioqueue._" not in data, name
            assert pickle.loads(data) is value
    # errors cross process boundaries (a worker pool, a result): they pickle and come back whole
    samples: list[BaseException] = [
        aioqueue.ConfigurationError("bad option"),
        aioqueue.ServerUnavailable("down"),
        aioqueue.BadSignature("tampered"),
        aioqueue.ResultTimeout("no result"),
        aioqueue.Retry(1.5),
    ]
    for error in samples:
        data = pickle.dumps(error)
        assert b"aioqueue._" not in data
        back = pickle.loads(data)
        assert type(back) is type(error)
        assert back.args == error.args


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
        if name in ("Retry", "RateLimited"):  # signals a job raises, not errors aioqueue raises
            assert not issubclass(exc, aioqueue.AioQueueError)
        elif issubclass(exc, Warning):  # warned, never raised: a UserWarning of our own
            assert (name, exc.__mro__[1]) == ("SyncTimeoutWarning", UserWarning)
        else:
            assert issubclass(exc, aioqueue.AioQueueError), name
    assert issubclass(aioqueue.ServerUnavailable, OSError)
    assert not issubclass(aioqueue.ServerUnavailable, ConnectionError)  # the builtin
    assert not issubclass(aioqueue.ServerRefused, OSError)  # an answer, not a lost connection
    assert issubclass(aioqueue.JobNotFound, LookupError)
    assert issubclass(aioqueue.InvalidHandle, ValueError)  # a bad string, like int("x")
    assert issubclass(aioqueue.BatchNotFound, LookupError)
    assert issubclass(aioqueue.CorruptRecord, ValueError)
    assert issubclass(aioqueue.ResultTimeout, TimeoutError)
    assert issubclass(aioqueue.PayloadTooLarge, aioqueue.SerializationError)


FAMILIES = (aioqueue.UsageError, aioqueue.ServerError, aioqueue.JobError)


def test_every_error_but_the_startup_one_is_in_exactly_one_family() -> None:
    for name in public_names():
        exc = getattr(aioqueue, name)
        if not (isinstance(exc, type) and issubclass(exc, aioqueue.AioQueueError)):
            continue
        if exc is aioqueue.AioQueueError or exc in FAMILIES:
            continue
        homes = [f.__name__ for f in FAMILIES if issubclass(exc, f)]
        assert len(homes) == (0 if exc is aioqueue.StartupFailed else 1), (name, homes)
    # one except clause per question a caller asks
    assert issubclass(aioqueue.ServerUnavailable, aioqueue.ServerError)
    assert issubclass(aioqueue.NotReplicated, aioqueue.ServerError)
    assert issubclass(aioqueue.JobFailed, aioqueue.JobError)
    assert issubclass(aioqueue.JobNotFound, aioqueue.JobError)
    assert issubclass(aioqueue.PayloadTooLarge, aioqueue.UsageError)
    assert issubclass(aioqueue.ConfigurationError, aioqueue.UsageError)


def test_the_drawn_exception_tree_is_the_real_one() -> None:
    # aioqueue._model.exceptions draws the tree in its docstring (shown in the API reference): each
    # name's parent in the drawing is its direct aioqueue base, and every error is drawn
    import aioqueue._model.exceptions as module

    doc = module.__doc__ or ""
    tree = doc.partition("::\n\n")[2].split("\n\n")[0].splitlines()
    drawn: dict[str, int] = {}
    parents: list[tuple[int, str]] = []
    for line in tree:
        match = re.match(r"^\s*((?:[│ ]   )*)(?:[├└]── )?(\w+)", line)
        assert match, line
        depth, name = len(match.group(1)) // 4 + ("──" in line), match.group(2)
        while parents and parents[-1][0] >= depth:
            parents.pop()
        base = (
            next(b for b in getattr(aioqueue, name).__bases__ if b.__module__ == "aioqueue")
            if parents
            else None
        )
        if parents:
            assert base is getattr(aioqueue, parents[-1][1]), (name, parents[-1][1])
        parents.append((depth, name))
        drawn[name] = depth
    errors = {
        n
        for n in public_names()
        if isinstance(v := getattr(aioqueue, n), type) and issubclass(v, aioqueue.AioQueueError)
    }
    assert set(drawn) == errors


# parameters that take a duration, by name: every one must accept a timedelta too
_DURATION = re.compile(r"(timeout|delay|lease|wait|grace|idle_block|period|retention|ttl)$")


def public_callables() -> Iterator[tuple[str, Callable[..., object]]]:
    """Every public function, and every public method (and ``__init__``) of a public class."""
    for name in aioqueue.__all__:
        obj = getattr(aioqueue, name)
        if inspect.isfunction(obj):
            yield name, obj
        elif inspect.isclass(obj):
            for attr, value in inspect.getmembers(obj):
                if attr.startswith("_") and attr != "__init__":
                    continue
                if inspect.isfunction(value) and value.__module__.startswith("aioqueue"):
                    yield f"{name}.{attr}", value


def test_every_duration_parameter_accepts_a_timedelta() -> None:
    found = set()
    for where, fn in public_callables():
        for param in inspect.signature(fn).parameters.values():
            if _DURATION.search(param.name):
                found.add(f"{where}({param.name})")
                assert "timedelta" in str(param.annotation), f"{where}({param.name}=...)"
    # the walk reaches the calls the docs lead users to (so it cannot pass by finding nothing)
    assert {
        "App.__init__(lease)",
        "App.__init__(socket_timeout)",
        "App.__init__(wait_timeout)",
        "App.batch(retention)",
        "Job.result(timeout)",
        "Batch.wait(timeout)",
        "Queue.reserve(wait)",
        "Queue.set_rate_limit(period)",
        "Task.options(delay)",
        "Worker.__init__(grace)",
        "Schedules.add(grace)",
        "App.schedule(grace)",
        "Worker.__init__(idle_block)",
        "Retry.__init__(delay)",
        "EmbeddedServer.__init__(startup_timeout)",
    } <= found


def test_durations_given_as_timedelta_mean_seconds() -> None:
    assert aioqueue.Retry(delay=timedelta(milliseconds=1500)).delay == 1.5
    assert aioqueue.App(lease=timedelta(minutes=1)).lease == 60.0
    app = aioqueue.App(socket_timeout=timedelta(seconds=4))
    assert app.socket_timeout == 4.0
    worker = aioqueue.Worker(app, grace=timedelta(seconds=2), idle_block=timedelta(seconds=1))
    assert (worker.grace, worker.idle_block) == (2.0, 1.0)
    backoff = aioqueue.Backoff(base=timedelta(milliseconds=250), max=timedelta(minutes=2))
    assert (backoff.base, backoff.max) == (0.25, 120.0)
    assert backoff == aioqueue.Backoff(base=0.25, max=120.0)
    with pytest.raises(aioqueue.ConfigurationError, match="delay"):
        aioqueue.Retry(delay="soon")  # type: ignore[arg-type]


def test_no_public_callable_takes_a_private_keyword() -> None:
    for where, fn in public_callables():
        private = [p for p in inspect.signature(fn).parameters if p.startswith("_")]
        assert not private, f"{where} takes {private}"


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


def test_the_operator_api_is_public() -> None:
    for name in ("AttemptInfo", "GroupInfo", "JobDetail", "JobPage", "JobSummary", "Throughput"):
        assert name in aioqueue.__all__
    for method in ("jobs", "job_detail", "requeue", "promote", "purge", "purge_queue", "cancel"):
        assert inspect.iscoroutinefunction(getattr(aioqueue.Queue, method)), method
    for method in ("throughput", "groups", "is_paused"):
        assert inspect.iscoroutinefunction(getattr(aioqueue.Queue, method)), method


def test_the_dashboard_lists_its_public_names() -> None:
    import aioqueue.dashboard as dashboard

    assert dashboard.__all__ == sorted(dashboard.__all__)
    assert dashboard.__all__ == ["AuthHook", "basic_auth", "create_app"]
    namespace: dict[str, object] = {}
    exec("from aioqueue.dashboard import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(dashboard.__all__)
    assert "auth" in inspect.signature(dashboard.create_app).parameters


def test_the_event_api_is_public() -> None:
    assert {"JobEvent", "JobEventKind"} <= set(aioqueue.__all__)
    for method in ("set_events", "events_maxlen", "events_page"):
        assert inspect.iscoroutinefunction(getattr(aioqueue.Queue, method)), method
    assert callable(aioqueue.App.events)
