"""The records of one task's jobs (``TaskRecords``, a task's ``builder``): its signature check,
its default options, and the template and record of a job with given options and arguments.
The three producers share it: ``task.enqueue`` (``task.py``), batches and chains
(``batch.py``) and the blocking producer (``sync.py``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .._model.checks import at_to_ms, expiry_option, new_job_id, to_ms
from .._model.record import JobOptions, JobRecord, Template
from .._model.signature import Signature
from .limiters import App as LimitersApp
from .limiters import bind_limits, limit_option

if TYPE_CHECKING:
    from .._model.codec import Codec

#: one call of ``enqueue_many``: keyword arguments, or an (args, kwargs) pair
ManyCall = Mapping[str, Any] | tuple[tuple[Any, ...], Mapping[str, Any]]


class RecordingApp(LimitersApp, Protocol):
    """What a task's records use of its App: its codec, and what limiters use."""

    @property
    def codec(self) -> Codec: ...


class RecordedTask(Protocol):
    """What ``TaskRecords`` reads of its task (a ``Task`` satisfies it)."""

    @property
    def app(self) -> RecordingApp: ...
    @property
    def name(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def limits(self) -> tuple[str, ...]: ...


class TaskRecords:
    """Builds the records of one task's jobs (an internal of ``Task``, left out of the API
    reference)."""

    __slots__ = ("_default_template", "_templates", "defaults", "sig", "task")

    def __init__(self, task: RecordedTask, sig: Signature) -> None:
        self.task = task
        #: checks a call's arguments against the function's signature
        self.sig = sig
        #: the options of a call without ``.options()``
        self.defaults = JobOptions()
        self._templates: dict[JobOptions, Template] = {}
        self._default_template: Template | None = None

    def pairs(self, queue: str, options: bytes, calls: Iterable[ManyCall]) -> list[Any]:
        """New ids and the payloads of ``calls`` on ``queue``: id, payload, id, payload, ...
        (every job of an ``enqueue_many`` shares one template, whose ``options`` each payload
        is signed with: only ids and payloads vary)."""
        task = self.task
        dump, name, check = task.app.codec.dump_args, task.name, self.sig.check
        pairs: list[Any] = []
        for call in calls:
            if isinstance(call, tuple):  # inline (the hot path of enqueue_many), as split_call
                args, kwargs = call
            else:
                args, kwargs = (), call
            check(args, kwargs)
            job_id = new_job_id()
            pairs.append(job_id)
            pairs.append(dump(queue, job_id, name, args, kwargs, options))
        return pairs

    def record(
        self,
        opts: JobOptions,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        queue: str,
        template: Template | None = None,
        job_id: str | None = None,
    ) -> JobRecord:
        """The record of one job of this task on ``queue`` with these options and arguments
        (and ``template``, when the caller changed the one ``opts`` give: the payload is
        signed together with the template's options); ``job_id`` when the caller chose it."""
        task = self.task
        job_id = job_id or opts.job_id or new_job_id()
        opts = bind_limits(task, opts, args, kwargs)  # its limit keys, from its arguments
        template = template or self.template(opts)
        payload = task.app.codec.dump_args(queue, job_id, task.name, args, kwargs, template.options)
        return JobRecord(job_id, payload, template)

    def template(self, opts: JobOptions) -> Template:
        """The template (everything but id and payload) of this task's jobs with ``opts``;
        it only depends on them, so it is made once per options object."""
        if opts is self.defaults:  # the common case, without hashing the options
            template = self._default_template
            if template is None:
                template = self._default_template = self._make_template(opts)
            return template
        template = self._templates.get(opts)
        if template is None:
            if len(self._templates) > 1000:  # many one-off options: do not grow without bound
                self._templates.clear()
            template = self._templates[opts] = self._make_template(opts)
        return template

    def _make_template(self, opts: JobOptions) -> Template:
        task = self.task
        extra: dict[str, Any] = {}
        if opts.timeout is not None:
            extra["timeout"] = opts.timeout
        if opts.result_ttl is not None:
            extra["result_ttl"] = opts.result_ttl
        if opts.expires is not None:
            key, value = expiry_option(opts.expires)
            extra[key] = value
        extra |= limit_option(task.app, opts.queue or task.queue, opts.limits)
        return Template(
            task.name,
            opts.max_attempts or task.max_attempts,
            -1 if opts.delay is None else to_ms(opts.delay, "delay"),
            -1 if opts.at is None else at_to_ms(opts.at),
            task.priority if opts.priority is None else opts.priority,
            opts.group or "",
            options=task.app.codec.dump_options(extra) if extra else b"",
            unique="" if opts.unique is None else opts.unique.template_value,
        )


def split_call(call: ManyCall) -> tuple[tuple[Any, ...], Mapping[str, Any]]:
    """One call of ``enqueue_many``: its positional and keyword arguments."""
    if isinstance(call, tuple):
        return call
    return (), call
