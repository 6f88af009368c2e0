"""The pull API of a ``Queue`` (``QueuePull``, a face it holds): ``reserve`` leases jobs to a
consumer that is not a worker, such as people working through jobs in a web app, and
``complete`` / ``fail`` / ``release`` / ``extend`` finish or renew them, fenced by the lease
token; ``Reservation`` is the leased job, and ``reservation_from`` rebuilds one from its handle
in a later request. Nothing here holds state.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .._model.checks import check_int, lease_ms, to_ms, to_seconds
from .._model.codec import Unrunnable
from .._model.exceptions import ConfigurationError, JobCancelled
from .._model.handle import HandleFields, dump_handle, load_handle
from .._model.limits import MAX_JOBS_PER_CALL
from .._model.record import Claimed
from .._store.outcomes import FailMode, Outcome
from .core import QueueCore
from .leases import Leases, forward_outbox

logger = logging.getLogger(__name__)


class _MadeBy:
    """The Queue that made a reservation, in a slot outside its dataclass fields: not
    compared, shown, copied by ``replace`` or deep-copied by ``asdict``."""

    __slots__ = ("_queue",)
    _queue: QueueCore | None

    def made_by(self, queue: QueueCore) -> None:
        """Remember the queue that made this reservation (``reserve``, ``reservation_from``),
        whose App signs its handle: an internal, left out of the API reference."""
        self._queue = queue


@dataclass(slots=True)
class Reservation(_MadeBy):
    """A job leased through the pull API; pass it back to complete/fail/release/extend."""

    id: str
    token: str
    task: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    attempt: int
    max_attempts: int
    queue: str
    options: dict[str, Any] = field(default_factory=dict)

    def handle(self) -> str:
        """This reservation as a short string, for a later request in any process:
        ``app.queue(name).reservation_from(handle)`` gives it back (without its arguments).
        Signed with the App's ``signing_key`` when there is one; it holds the lease token,
        so keep it as secret as the lease (see docs/pull-api.md).

        Raises:
            ConfigurationError: the reservation was built by hand, not by ``reserve`` or
                ``reservation_from``.
        """
        queue: QueueCore | None = getattr(self, "_queue", None)  # set by reserve, reservation_from
        if queue is None:
            raise ConfigurationError(
                "this Reservation was built by hand; only those from reserve() or "
                "reservation_from() have a handle"
            )
        fields = HandleFields(
            self.queue,
            self.id,
            self.token,
            self.task,
            self.attempt,
            self.max_attempts,
            self.options,
        )
        return dump_handle(queue.app.codec.signer, fields)


class QueuePull:
    """The pull API of a ``Queue`` (which holds one and offers its methods): lease jobs with
    ``reserve``, then finish each with ``complete``, ``fail`` or ``release``, or renew its
    lease with ``extend``."""

    __slots__ = ("core",)

    def __init__(self, core: QueueCore) -> None:
        self.core = core

    async def reserve(
        self,
        n: int = 1,
        *,
        lease: float | timedelta | None = None,
        wait: float | timedelta | None = None,
    ) -> list[Reservation]:
        """Lease up to ``n`` runnable jobs, highest priority first.

        Args:
            n: how many jobs at most (one call leases at most 1,000).
            lease: seconds until an abandoned reservation returns to the queue (default: the
                App's ``lease``); renew it with ``extend``.
            wait: when nothing is runnable, block up to this many seconds for a job (no
                polling); ``None`` returns at once.

        Returns:
            The reservations, possibly empty. Jobs whose payload cannot be decoded are
            dead-lettered with the reason instead of being returned.
        """
        check_int(n, 1, "n")
        lease_for = lease_ms(self.core.app.lease if lease is None else lease)
        wait_s = to_seconds(wait, "wait")
        loop = asyncio.get_running_loop()
        deadline = None if wait_s is None else loop.time() + wait_s
        woken = False
        leases = self.core.leases
        while True:
            res = await leases.claim(min(n, MAX_JOBS_PER_CALL), lease_for)
            out = []
            for c in res.jobs:
                r = await self._decode(leases, c)
                if r is not None:
                    out.append(r)
            if out or deadline is None:
                return out
            if res.jobs:  # all were undecodable: try again at once
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                if woken:
                    # leaving empty-handed with a wake-up we took: hand it back, another
                    # consumer may be blocked on an older, longer timeout
                    await leases.wake()
                return []
            # below the socket timeout, so a long wait never looks like a dead connection
            block = min(remaining, self.core.app.socket_timeout / 2)
            if res.next_wake_ms >= 0:
                block = min(block, max((res.next_wake_ms - res.now_ms) / 1000, 0.001))
            woken = await self.core.door.wait_for_wake(block) or woken

    async def _decode(self, leases: Leases, c: Claimed) -> Reservation | None:
        """A leased job as a Reservation, its arguments read by its task's type hints if this
        App has the task; one that cannot be decoded is dead-lettered with the reason
        (``CorruptPayload``, ``InvalidArguments`` or ``BadSignature``, as a worker would).
        A claim-checked payload is read from the payload store first; if the store fails,
        the job is released (its attempt given back) for a later reserve, and left out."""
        try:
            blob = await leases.codec.fetch_blob(self.core.name, c.id, c.payload)
        except Exception as exc:
            logger.warning("job %s: the payload store failed (%r); released", c.id, exc)
            await leases.release([(c.id, c.token)])
            return None
        try:
            args, kwargs, options = leases.decode(c, blob)
            task = self.core.app.tasks.get(c.task)  # its hints, when this App has the task
            decode = None if task is None else task.args_decoder
            if decode is not None:
                try:
                    args, kwargs = decode(args, kwargs)
                except Exception as exc:
                    raise Unrunnable("InvalidArguments", str(exc)) from exc
        except Exception as exc:
            await leases.fail(c.id, c.token, exc, FailMode.DEAD)
            return None
        r = Reservation(
            c.id,
            c.token,
            c.task,
            args,
            kwargs,
            c.attempt,
            c.max_attempts,
            self.core.name,
            options,
        )
        r.made_by(self.core)
        return r

    def reservation_from(self, handle: str) -> Reservation:
        """The reservation a handle (``Reservation.handle()``) stands for, to ``complete``,
        ``fail``, ``release`` or ``extend`` in a later request, in any process. No I/O: a
        lease that is over is found out by those calls (``LeaseLost``), as with the
        reservation itself. Its ``args`` and ``kwargs`` are empty (a handle does not carry
        them; ``queue.job(r.id).info()`` reads them) and its ``options`` hold only what
        completing needs.

        Raises:
            InvalidHandle: not a handle of this queue: garbled, another queue's, or (with a
                ``signing_key``) tampered, unsigned or signed with a key not accepted here.
        """
        f = load_handle(self.core.app.codec.signer, self.core.name, handle)
        r = Reservation(
            f.job_id, f.token, f.task, (), {}, f.attempt, f.max_attempts, self.core.name, f.options
        )
        r.made_by(self.core)
        return r

    async def complete(self, reservation: Reservation, result: Any = None) -> None:
        """Finish a reserved job with its result.

        Raises:
            LeaseLost: the lease ran out and the job went to another consumer, or it finished.
            JobNotFound: the job's record is gone.
            SerializationError: the result cannot be serialised (nothing is changed).
        """
        codec = self.core.app.codec
        data = codec.dump_result(
            result,
            queue=self.core.name,
            job_id=reservation.id,
            task=reservation.task,
            options=reservation.options,
        )
        task = self.core.app.tasks.get(reservation.task)
        ttl = codec.result_ttl_ms(reservation.options, None if task is None else task.result_ttl)
        outcome = (
            await self.core.leases.complete([(reservation.id, reservation.token, data, ttl)])
        )[0]
        outcome.check(reservation.id)
        if outcome is Outcome.FORWARD:  # its batch lives on another queue: hand it over now
            try:
                await forward_outbox(self.core)
            except Exception as exc:  # the job completed; a worker's or reap's turn forwards it
                logger.warning(
                    "job %s completed; forwarding its batch outcome failed: %r", reservation.id, exc
                )

    async def fail(
        self,
        reservation: Reservation,
        error: BaseException | str,
        *,
        retry: bool = True,
        delay: float | timedelta | None = None,
    ) -> bool:
        """Record a failed attempt. With ``retry`` and attempts left, the job runs again after
        ``delay`` (default: the App's backoff); otherwise it is dead-lettered.

        Returns:
            True if a retry was scheduled, False if the job was dead-lettered.
        """
        mode, delay_ms = FailMode.DEAD, 0
        if retry:
            d = to_seconds(delay, "delay")
            mode = FailMode.RETRY
            delay_ms = to_ms(
                self.core.app.backoff.delay(reservation.attempt) if d is None else d, "delay"
            )
        outcome = await self.core.leases.fail(
            reservation.id, reservation.token, error, mode, delay_ms
        )
        outcome.check(reservation.id)
        return outcome is Outcome.RETRY

    async def release(
        self, reservation: Reservation, *, delay: float | timedelta = 0, refund: bool = True
    ) -> None:
        """Give a reserved job back unfinished; by default its attempt is not counted."""
        pairs = [(reservation.id, reservation.token)]
        outcome = (await self.core.leases.release(pairs, to_ms(delay, "delay"), refund))[0]
        outcome.check(reservation.id)

    async def extend(
        self, reservation: Reservation, *, lease: float | timedelta | None = None
    ) -> None:
        """Renew a reservation's lease to ``lease`` seconds from now (server clock).

        Raises:
            JobCancelled: the job was cancelled meanwhile; it is now recorded as cancelled
                and the reservation is over.
            LeaseLost, JobNotFound: as for ``complete``.
        """
        lease_for = lease_ms(self.core.app.lease if lease is None else lease)
        leases = self.core.leases
        outcome = (await leases.extend([(reservation.id, reservation.token)], lease_for))[0]
        if outcome is Outcome.CANCEL_REQUESTED:
            why = Unrunnable("Cancelled", "cancelled while reserved")
            await leases.fail(reservation.id, reservation.token, why, FailMode.CANCELLED)
            raise JobCancelled(reservation.id)
        outcome.check(reservation.id)
