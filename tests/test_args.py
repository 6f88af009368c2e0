"""Typed arguments and results (``_convert.py``, ``_serialize.py``): dataclasses, datetimes,
UUIDs, Decimals, Enums and Pydantic models go through JSON and come back as the task's type
hints ask, in a real worker, through the pull API, with signing and beside pickle."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import logging
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Annotated, Any, Optional

import orjson
import pydantic
import pytest
from redis.asyncio import Redis

from aioqueue import App, JobFailed, SerializationError, Task, Worker
from aioqueue._model.serialize import JsonSerializer, _encode_stdlib

from .support.apps import open_app

SIGNING_KEY = "k" * 32


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclasses.dataclass(frozen=True)
class Point:
    x: float
    y: float


@dataclasses.dataclass
class Order:
    id: uuid.UUID
    placed: datetime
    total: Decimal
    colours: list[Colour]
    where: Point
    note: str | None = None
    lines: int = dataclasses.field(default=0, init=False)  # not written out


@dataclasses.dataclass
class Node:
    name: str
    children: list[Node] = dataclasses.field(default_factory=list)


class Customer(pydantic.BaseModel):
    name: str
    born: date
    points: list[Point] = []


MOMENT = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
VALUES: list[tuple[str, Any, Any]] = [
    ("aware datetime", datetime, MOMENT),
    ("offset datetime", datetime, MOMENT.astimezone(timezone(timedelta(hours=-5)))),
    ("naive datetime", datetime, datetime(2030, 1, 2, 3, 4, 5)),
    ("date", date, date(2030, 1, 2)),
    ("time", time, time(13, 14, 15, 16)),
    ("uuid", uuid.UUID, uuid.UUID("12345678-1234-5678-1234-567812345678")),
    ("decimal", Decimal, Decimal("0.10")),  # exact: not the float 0.1
    ("enum", Colour, Colour.BLUE),
    ("int enum", Level, Level.HIGH),
    ("dataclass", Point, Point(1.5, -2.0)),
    ("pydantic", Customer, Customer(name="ann", born=date(1990, 5, 6), points=[Point(0, 1)])),
]


def echo_task(app: App, tp: Any, seen: list[Any], name: str = "echo") -> Task[Any, Any]:
    """A task ``echo(value: tp) -> tp`` that records what it received."""

    async def echo(value: Any) -> Any:
        seen.append(value)
        return value

    echo.__annotations__ = {"value": tp, "return": tp}
    return app.task(name=name)(echo)


async def drain(app: App) -> None:
    await Worker(app, burst=True).run()


@pytest.mark.parametrize(("tp", "value"), [v[1:] for v in VALUES], ids=[v[0] for v in VALUES])
async def test_each_type_round_trips_as_argument_and_result(app: App, tp: Any, value: Any) -> None:
    seen: list[Any] = []
    echo = echo_task(app, tp, seen)
    job = await echo.enqueue(value)
    by_keyword = await echo.enqueue(value=value)
    await drain(app)
    assert seen == [value, value]
    assert all(type(v) is type(value) for v in seen)
    for j in (job, by_keyword):
        result = await j.result(timeout=10)
        assert result == value
        assert type(result) is type(value)
    if isinstance(value, datetime):
        assert seen[0].utcoffset() == value.utcoffset()  # the offset survives, naive stays naive


async def test_nested_annotations_are_read_at_every_level(app: App) -> None:
    seen: list[Any] = []

    @app.task
    async def book(
        orders: list[Order],
        by_day: dict[str, date],
        when: Optional[datetime],  # noqa: UP045 - the typing spelling is read too
        maybe: datetime | None,
        pair: tuple[int, uuid.UUID],
        people: list[Customer],
        *extra: Decimal,
        **levels: Level,
    ) -> dict[str, list[Order]]:
        seen.append((orders, by_day, when, maybe, pair, people, extra, levels))
        return {"all": orders}

    order = Order(uuid.uuid4(), MOMENT, Decimal("19.99"), [Colour.RED, Colour.BLUE], Point(1, 2))
    order.lines = 3
    days = {"start": date(2030, 1, 1), "end": date(2030, 2, 1)}
    ann = Customer(name="ann", born=date(1990, 1, 1))
    job = await book.enqueue(
        [order], days, None, MOMENT, (7, order.id), [ann], Decimal("1.5"), Decimal(2), a=Level.LOW
    )
    await drain(app)
    ((orders, by_day, when, maybe, pair, people, extra, levels),) = seen
    expected = dataclasses.replace(order)  # init=False fields start at their default again
    assert orders == [expected]
    assert isinstance(orders[0].colours[1], Colour)
    assert orders[0].where == Point(1, 2)
    assert orders[0].lines == 0
    assert by_day == days
    assert when is None
    assert maybe == MOMENT
    assert pair == (7, order.id)
    assert people == [ann]
    assert extra == (Decimal("1.5"), Decimal(2))
    assert all(type(d) is Decimal for d in extra)
    assert levels == {"a": Level.LOW}
    assert type(levels["a"]) is Level
    assert await job.result(timeout=10) == {"all": [expected]}


async def test_plain_annotations_cost_nothing_and_any_gets_the_json_form(app: App) -> None:
    seen: list[Any] = []

    @app.task
    async def plain(a: int, b: str, c: list[int], d: dict[str, Any], e: Any, f: bool = True) -> Any:
        seen.append(e)
        return e

    @app.task
    async def bare(a, b):  # type: ignore[no-untyped-def]
        return None

    for task in (plain, bare):
        assert task.args_decoder is None
        assert task.result_converter is None
    job = await plain.enqueue(1, "x", [1], {}, {"at": MOMENT, "id": uuid.UUID(int=1)})
    await drain(app)
    form = {"at": MOMENT.isoformat(), "id": "00000000-0000-0000-0000-000000000001"}
    assert seen == [form]
    assert await job.result(timeout=10) == form


async def test_enqueue_by_name_is_plain_json_and_the_worker_still_reads_the_hints(app: App) -> None:
    seen: list[Any] = []
    echo_task(app, date, seen)
    q = app.queue()
    by_string = await q.enqueue("echo", ["2030-01-02"])
    by_value = await q.enqueue("echo", kwargs={"value": date(2030, 1, 3)})
    await drain(app)
    assert seen == [date(2030, 1, 2), date(2030, 1, 3)]
    # a handle from the queue knows no task, hence no annotation: the result's JSON form
    assert await by_string.result(timeout=10) == "2030-01-02"
    assert await q.job(by_value.id).result(timeout=10) == "2030-01-03"


async def test_an_argument_that_does_not_fit_dead_letters_the_job_at_once(app: App) -> None:
    seen: list[Any] = []
    echo_task(app, date, seen)
    job = await app.queue().enqueue("echo", ["not a date"], max_attempts=5)
    await drain(app)
    assert seen == []
    with pytest.raises(JobFailed) as failed:
        await job.result(timeout=10)
    assert failed.value.error_type == "InvalidArguments"
    assert "'value'" in failed.value.error_message
    assert "not a date" in failed.value.error_message
    assert (await job.info()).attempts == 1  # not retried: it would not fit next time either


async def test_a_result_that_does_not_fit_raises_serialization_error(app: App) -> None:
    @app.task
    async def liar() -> date:
        return "soon"  # type: ignore[return-value]

    job = await liar.enqueue()
    await drain(app)
    with pytest.raises(SerializationError, match="return annotation"):
        await job.result(timeout=10)
    assert await app.queue().job(job.id).result(timeout=10) == "soon"


@pytest.mark.parametrize(
    "bad",
    [
        {1, 2},
        object(),
        Point(object(), 1),  # type: ignore[arg-type]
        [b"bytes"],
        Customer.model_construct(name=object()),
    ],
    ids=["set", "object", "dataclass holding an object", "bytes", "model holding an object"],
)
async def test_what_cannot_be_encoded_is_refused_at_enqueue(
    app: App, redis: Redis, bad: Any
) -> None:
    echo = echo_task(app, Any, [])
    with pytest.raises(SerializationError, match="json"):
        await echo.enqueue(bad)
    assert await redis.keys(f"{app.prefix}*") == []


async def test_non_finite_floats_inside_dataclasses_and_models_are_refused(app: App) -> None:
    echo = echo_task(app, Any, [])
    for bad in (
        Point(float("nan"), 0),
        Customer(name="a", born=date.today(), points=[Point(0, 1e999)]),
    ):
        with pytest.raises(SerializationError):
            await echo.enqueue(bad)


def test_orjson_and_the_json_module_write_the_same_forms() -> None:
    """The stdlib fallback (no orjson) must write what orjson writes, or hints read it back
    differently depending on the producer's install."""
    order = Order(uuid.UUID(int=5), MOMENT, Decimal("1.10"), [Colour.RED], Point(0.5, 2))
    for value in [v[2] for v in VALUES] + [order, {"d": date(2030, 1, 1)}]:
        ours = JsonSerializer().dumps(value)
        stdlib = json.dumps(value, separators=(",", ":"), default=_encode_stdlib).encode()
        assert orjson.loads(ours) == orjson.loads(stdlib), value


async def test_pull_api_reads_the_hints_of_a_task_the_app_has(app: App) -> None:
    echo_task(app, list[Point], [])
    q = app.queue()
    job = await q.enqueue("echo", [[{"x": 1, "y": 2}]])
    await q.enqueue("other.task", [{"x": 1, "y": 2}])  # a task this App does not have
    first, second = await q.reserve(2, lease=30)
    assert first.args == ([Point(1, 2)],)
    assert second.args == ({"x": 1, "y": 2},)
    await q.complete(first, [Point(3, 4)])
    await q.complete(second, None)
    assert await q.job(job.id).result(timeout=10) == [{"x": 3, "y": 4}]


async def test_pickle_apps_are_untouched(redis_url: str) -> None:
    seen: list[Any] = []
    async with open_app(redis_url, serializer="pickle", signing_key=SIGNING_KEY) as pickle_app:
        echo = echo_task(pickle_app, Order, seen)
        assert echo.args_decoder is None
        assert echo.result_converter is None
        order = Order(uuid.uuid4(), MOMENT, Decimal("3"), [Colour.RED], Point(0, 0))
        order.lines = 9  # pickle keeps every field, init=False ones included
        job = await echo.enqueue(order)
        await drain(pickle_app)
        assert seen == [order]
        assert seen[0].lines == 9
        assert (await job.result(timeout=10)).lines == 9


async def test_signed_apps_round_trip_typed_values(redis_url: str, redis: Redis) -> None:
    seen: list[Any] = []
    async with open_app(redis_url, signing_key=SIGNING_KEY) as app:
        echo = echo_task(app, dict[str, Customer], seen)
        value = {"a": Customer(name="ann", born=date(2000, 1, 1))}
        job = await echo.enqueue(value)
        raw = await redis.hget(app.queue()._keys.job(job.id), "p")
        assert raw is not None
        assert b'"born":"2000-01-01"' in raw
        await drain(app)
        assert seen == [value]
        assert await job.result(timeout=10) == value


async def test_chain_steps_receive_the_previous_result_by_their_hints(app: App) -> None:
    seen: list[Any] = []

    @app.task
    async def start() -> Point:
        return Point(1, 2)

    @app.task
    async def after(p: Point) -> None:
        seen.append(p)

    await start.call().then(after).enqueue()
    await drain(app)
    assert seen == [Point(1, 2)]


async def test_unresolvable_hints_warn_and_pass_json(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[Any] = []

    async def ghost(value: NoSuchType) -> None:  # type: ignore[name-defined]  # noqa: F821
        seen.append(value)

    task = app.task(name="ghost")(ghost)
    with caplog.at_level(logging.WARNING, logger="aioqueue._model.convert"):
        assert task.args_decoder is None
    assert "NoSuchType" in caplog.text
    assert "'ghost'" in caplog.text
    await task.enqueue("2030-01-01")
    await drain(app)
    assert seen == ["2030-01-01"]


def converter_of(tp: Any) -> Callable[[Any], Any]:
    from aioqueue._model.convert import converter

    c = converter(tp)
    assert c is not None
    return c


def test_unions_take_the_first_member_that_fits() -> None:
    c = converter_of(int | datetime)
    assert c(5) == 5
    assert c(MOMENT.isoformat()) == MOMENT
    c = converter_of(datetime | str)
    assert c(MOMENT.isoformat()) == MOMENT
    assert c("hello") == "hello"
    with pytest.raises(ValueError, match="fits none"):
        converter_of(datetime | Colour)("green")


async def test_the_blocking_producer_sends_and_reads_typed_values(app: App) -> None:
    seen: list[Any] = []
    echo = echo_task(app, list[Point], seen)
    value = [Point(1, 2), Point(3, 4)]
    sync = app.sync()
    one = await asyncio.to_thread(sync.enqueue, echo, value)
    (many,) = await asyncio.to_thread(sync.enqueue_many, echo, [((value,), {})])
    by_name = await asyncio.to_thread(sync.enqueue_by_name, "default", "echo", [[{"x": 5, "y": 6}]])
    await drain(app)
    assert seen == [value, value, [Point(5, 6)]]
    assert await asyncio.to_thread(one.result, 10) == value
    assert await asyncio.to_thread(many.result, 10) == value
    assert await asyncio.to_thread(by_name.result, 10) == [{"x": 5, "y": 6}]  # no task known


def test_a_dataclass_may_hold_itself_and_annotations_may_be_unhashable() -> None:
    tree = Node("root", [Node("a", [Node("a1")]), Node("b")])
    c = converter_of(Node)
    assert c(orjson.loads(JsonSerializer().dumps(tree))) == tree
    odd = Annotated[date, ["unhashable metadata"]]
    assert converter_of(odd)("2030-01-01") == date(2030, 1, 1)


def test_a_value_of_the_wrong_json_kind_is_named() -> None:
    with pytest.raises(ValueError, match="expected a JSON list for tuple"):
        converter_of(tuple[int, date])("2030-01-01")
    with pytest.raises(ValueError, match="expected a JSON dict for Point"):
        converter_of(Point)([1, 2])
    with pytest.raises(ValueError, match="expected 2 items"):
        converter_of(tuple[int, date])([1])
