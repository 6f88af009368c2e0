"""The dashboard's actions, each one call of the operator API (``Queue.requeue``, ``promote``,
``cancel``, ``purge``, ``pause``, ``resume``): on the selected jobs, or on every job matching
the listing's filters; and a job page's ``change`` (``Job.change``). Returns the line the page
shows after it."""

from __future__ import annotations

from aioqueue._model.exceptions import ConfigurationError, JobNotChangeable
from aioqueue._queue.queue import Queue
from aioqueue.dashboard._page import one

#: the actions each state's listing offers (a job page offers those of its state)
OFFERED = {
    "scheduled": ("promote", "cancel", "delete"),
    "queued": ("cancel", "delete"),
    "active": ("cancel",),
    "failed": ("retry", "delete"),
    "completed": ("delete",),
    "cancelled": ("delete",),
}
#: the states whose jobs ``cancel`` reaches
CANCELLABLE = ("queued", "scheduled", "active")


async def run_action(q: Queue, form: dict[str, list[str]]) -> str:
    """Run the action a form asks for on queue ``q``; the message to show.

    Raises:
        ConfigurationError: an unknown action, a bad selection or filter.
    """
    action, _, scope = (one(form, "action") or "").partition(":")
    group = one(form, "group")
    if action in ("pause", "resume"):
        await (q.pause(group) if action == "pause" else q.resume(group))
        what = f"group {group!r}" if group else f"queue {q.name!r}"
        return f"{action}d {what}"
    if action == "purge-group":
        if group is None:
            raise ConfigurationError("purge-group needs a group")
        n = await q.purge("queued", group=group)
        return f"purged {n} queued jobs of group {group!r}"
    if action == "change":
        return await _change(q, form)
    state = one(form, "state") or ""
    if action not in OFFERED.get(state, ()):
        raise ConfigurationError(f"{action or 'no action'!r} is not offered for {state!r} jobs")
    task = one(form, "task")
    if scope == "all":
        n = await _all(q, action, state, task, group)
        return f"{action}: {n} jobs ({state}, every one matching)"
    ids = [i for i in form.get("ids", []) if i]
    if not ids:
        raise ConfigurationError("no job selected")
    n = await act_on(q, action, state, ids)
    return f"{action}: {n} of {len(ids)} selected jobs"


async def _change(q: Queue, form: dict[str, list[str]]) -> str:
    """A job page's change form: the job's new priority and/or delay (``Job.change``)."""
    job_id = one(form, "ids")
    if job_id is None:
        raise ConfigurationError("no job selected")
    try:
        pr, delay = one(form, "priority"), one(form, "delay")
        priority = None if pr is None else int(pr)
        seconds = None if delay is None else float(delay)
        state = await q.job(job_id).change(priority=priority, delay=seconds)
    except (ValueError, JobNotChangeable) as exc:
        raise ConfigurationError(str(exc)) from None
    return f"changed job {job_id}: now {state.value}"


async def act_on(q: Queue, action: str, state: str, ids: list[str]) -> int:
    """Run ``action`` on the jobs ``ids`` of ``state``; how many it reached."""
    if action == "retry":
        return await q.requeue(ids)
    if action == "promote":
        return await q.promote(ids)
    if action == "cancel":
        return await q.cancel(ids)
    return await q.purge(state, ids)


async def _all(q: Queue, action: str, state: str, task: str | None, group: str | None) -> int:
    every = task is None and group is None
    if action == "retry":
        return await q.requeue(task=task, group=group, all=every)
    if action == "promote":
        return await q.promote(task=task, group=group, all=every)
    if action == "cancel":
        return await q.cancel(state=state, task=task, group=group, all=every)
    return await q.purge(state, task=task, group=group)
