"""What every face of a queue shares (``QueueCore``): its App, name and keys, the door to its
keys (``QueueScripts``, made again when the App's client changes), its leases, its enqueue
coalescer, and reading a job's record. ``Queue`` is this core, holding its faces: ``QueuePull``
(``pull.py``), ``QueueAdmin`` (``admin.py``) and ``QueueEvents`` (``events.py``), each an object
over this core whose public methods the ``Queue`` offers as its own (``_model/held.py``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from .._model.checks import check_name
from .._model.codec import Codec
from .._model.exceptions import JobNotFound
from .._model.job import ErrorInfo, JobInfo, parse_state
from .._model.keys import QueueKeys
from .._model.limits import DEFAULT_MAX_ATTEMPTS
from .._store.scripts import QueueScripts
from .coalesce import Coalescer
from .leases import Leases
from .tasktable import Known

if TYPE_CHECKING:
    from .owner import QueueOwner

T = TypeVar("T")


class QueueCore:
    """A queue's App, name and keys, and the objects every face of it uses."""

    def __init__(self, app: QueueOwner, name: str) -> None:
        self.app = app
        self.name = check_name("queue name", name)
        self._keys = QueueKeys(app.prefix, name)
        self._scripts_obj: QueueScripts | None = None
        self._leases_obj: Leases | None = None
        self._coalescer_obj: Coalescer | None = None
        self._known = Known()

    @property
    def _scripts(self) -> QueueScripts:
        s = self._scripts_obj
        if s is None or s.client is not self.app.redis:
            s = self._scripts_obj = QueueScripts(self.app.redis, self._keys)
        return s

    @property
    def door(self) -> QueueScripts:
        """The door to this queue's keys on the App's current client (``_store/scripts.py``;
        its ``keys`` are this queue's): an internal of the App's other parts, left out of the
        API reference."""
        return self._scripts

    @property
    def coalescer(self) -> Coalescer:
        """The queue's enqueue coalescer (``coalesce.py``): an internal, as ``door``."""
        c = self._coalescer_obj
        scripts = self._scripts
        if c is None or c.scripts is not scripts:
            c = self._coalescer_obj = Coalescer(scripts)
        return c

    @property
    def leases(self) -> Leases:
        """The queue's leases (``leases.py``: claims, completions, fails, releases): an
        internal, as ``door``."""
        leases = self._leases_obj
        if leases is None or leases.scripts is not self._scripts:
            leases = self._leases_obj = Leases(self)
        return leases

    async def job_info(self, job_id: str) -> JobInfo:
        """What ``self.job(job_id).info()`` gives: the job's state, attempts, times, error and
        arguments.

        Raises:
            JobNotFound: the job has no record.
            CorruptRecord: its state cannot be read.
        """
        raw = await self._scripts.job_record(job_id)
        return job_info_from(self.app.codec, self.name, job_id, raw)


def job_info_from(codec: Codec, queue: str, job_id: str, raw: Mapping[bytes, bytes]) -> JobInfo:
    """A JobInfo from a job's stored hash (``raw``): a field that cannot be read reads as
    absent and is named in ``JobInfo.garbled``.

    Raises:
        JobNotFound: there is no record (an empty hash).
        CorruptRecord: its state cannot be read.
    """
    if not raw:
        raise JobNotFound(job_id)
    return _RecordReader(codec, job_id, raw).info(queue)


class _RecordReader:
    """Reads a job's stored hash field by field: a field that cannot be read reads as absent
    and is named in ``garbled`` (only an unreadable state raises CorruptRecord)."""

    def __init__(self, codec: Codec, job_id: str, raw: Mapping[bytes, bytes]) -> None:
        self.codec = codec
        self.job_id = job_id
        self.h = {k.decode(errors="replace"): v for k, v in raw.items()}
        self.garbled: list[str] = []

    def _read(self, field: str, name: str, parse: Callable[[bytes], T]) -> T | None:
        if field not in self.h:
            return None
        try:
            return parse(self.h[field])
        except Exception:  # anything a foreign writer left: JSON, numbers, encodings
            self.garbled.append(name)
            return None

    def _int(self, field: str, name: str) -> int | None:
        return self._read(field, name, int)

    def _max_attempts(self) -> int:
        """Field m: absent, the default (a new record stores it only when it differs)."""
        if "m" not in self.h:
            return DEFAULT_MAX_ATTEMPTS
        return self._int("m", "max_attempts") or 1

    def info(self, queue: str) -> JobInfo:
        codec, h = self.codec, self.h
        state = parse_state(self.job_id, h.get("s", b""))
        task = h.get("t", b"").decode(errors="replace")
        args: tuple[Any, ...] | None = None
        kwargs: dict[str, Any] | None = None
        encrypted = codec.is_encrypted(h.get("p", b""))
        try:  # a corrupt or unverified payload still has an inspectable record
            args, kwargs = codec.load_args(
                queue, self.job_id, task, h.get("p", b""), h.get("o", b"")
            )
        except Exception:
            if not (encrypted and codec.encrypter is None):  # not garbled: only sealed here
                self.garbled += ["args", "kwargs"]
        error: ErrorInfo | None = codec.load_error(h["e"]) if "e" in h else None
        info = JobInfo(
            id=self.job_id,
            queue=queue,
            task=task,
            state=state,
            attempts=self._int("a", "attempts") or 0,
            max_attempts=self._max_attempts(),
            priority=self._int("pr", "priority") or 0,
            created_ms=self._int("ct", "created_ms") or 0,
            due_ms=self._int("due", "due_ms"),
            finished_ms=self._int("f", "finished_ms"),
            error=error,
            args=args,
            kwargs=kwargs,
            progress=self._read("pg", "progress", codec.json.loads),
            encrypted=encrypted,
        )
        if self.garbled:
            info = dataclasses.replace(info, garbled=tuple(self.garbled))
        return info
