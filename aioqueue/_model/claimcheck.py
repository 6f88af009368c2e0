"""Claim-check of large payloads (``App(payload_store=...)``): a job's arguments over a
threshold are kept in a store the user provides, and its record holds a small reference.

The reference is ``MARKER`` (``\\x00aqc1``) | length (8 bytes, big-endian) | SHA-256 of the
blob (32 bytes) | the store key (UTF-8). The blob is the payload as it would have been stored
in Redis (compressed, then encrypted); the reference takes its place, and with signing on the
MAC covers it (so the length and digest): a swapped or altered blob is refused before it is
read. The key is derived from the job (prefix, queue, id; never the attempt): a retry reads
the same blob, and the worker reads it from the key it derives, never from one the record
names.

Blobs are removed with their job: by the worker once its completion is stored, by
``Queue.purge`` for the jobs it deletes, and by ``sweep_payloads`` for the orphans of jobs
Redis deleted itself (retention expiry) or that were purged in bulk.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable
from urllib.parse import quote

from .exceptions import ConfigurationError

logger = logging.getLogger("aioqueue")

MARKER = b"\x00aqc1"
_FIXED = len(MARKER) + 8 + 32
#: the default threshold: payloads of 256 KiB or more (as stored) go to the store
DEFAULT_ABOVE = 256 * 1024


@runtime_checkable
class PayloadStore(Protocol):
    """Where large payloads are kept: any object with these coroutines (an object store, a
    file system, a database). ``get`` returns None for a key it does not hold; ``delete``
    ignores keys it does not hold. ``scan`` (for ``sweep_payloads``) lists up to ``limit``
    keys that start with ``prefix``, from an opaque ``cursor`` ("" first), with the cursor
    of the next page ("" at the end)."""

    async def put(self, key: str, data: bytes) -> None:
        """Keep ``data`` under ``key`` (replacing what is there)."""
        ...

    async def get(self, key: str) -> bytes | None:
        """The data kept under ``key``; None when there is none."""
        ...

    async def delete(self, keys: Sequence[str]) -> None:
        """Remove ``keys`` (those that do not exist are ignored)."""
        ...

    async def scan(self, prefix: str, cursor: str, limit: int) -> tuple[list[str], str]:
        """Up to ``limit`` keys starting with ``prefix``, from ``cursor`` ("" first), and the
        cursor of the next page ("" at the end)."""
        ...


@dataclass(frozen=True, slots=True)
class ClaimCheck:
    """``App(payload_store=ClaimCheck(store, above=...))``: payloads of ``above`` bytes or
    more (compressed and encrypted, as they would be stored) go to ``store``."""

    store: PayloadStore
    above: int = DEFAULT_ABOVE


class MissingPayload(Exception):
    """The reason a job whose blob is gone, or altered, is dead-lettered (``kind``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def job_key(prefix: str, queue: str, job_id: str) -> str:
    """The store key of a job's payload: the queue quoted, so a key names one queue only."""
    return f"{queue_prefix(prefix, queue)}{job_id}"


def queue_prefix(prefix: str, queue: str) -> str:
    """What every store key of ``queue``'s payloads starts with."""
    return f"aioqueue/{quote(prefix, safe='')}/{quote(queue, safe='')}/"


def reference(key: str, blob: bytes) -> bytes:
    """The reference a record holds in place of ``blob``."""
    return MARKER + len(blob).to_bytes(8, "big") + hashlib.sha256(blob).digest() + key.encode()


def is_reference(data: bytes) -> bool:
    return data.startswith(MARKER)


def check_blob(ref: bytes, key: str, blob: bytes | None) -> bytes:
    """``blob`` if it is the one ``ref`` (for the store key ``key``) was made for.

    Raises:
        MissingPayload: no blob (``MissingPayload``), or not the one of the reference
            (``TamperedPayload``), or a reference made for another key.
    """
    if len(ref) < _FIXED or ref[_FIXED:] != key.encode():
        raise MissingPayload("TamperedPayload", "the payload reference is not this job's")
    if blob is None:
        raise MissingPayload(
            "MissingPayload", f"the payload store holds no blob for this job (key {key!r})"
        )
    size = int.from_bytes(ref[len(MARKER) : len(MARKER) + 8], "big")
    if len(blob) != size or hashlib.sha256(blob).digest() != ref[len(MARKER) + 8 : _FIXED]:
        raise MissingPayload(
            "TamperedPayload",
            f"the payload store's blob for this job is not the one enqueued (key {key!r})",
        )
    return blob


class ClaimChecker:
    """One App's claim-check: its store, threshold, and the blobs between ``dump`` and
    ``flush`` (made while a record is built, put before it is stored)."""

    __slots__ = ("_tasks", "above", "fetched", "pending", "prefix", "store")

    def __init__(self, setting: PayloadStore | ClaimCheck, prefix: str) -> None:
        spec = setting if isinstance(setting, ClaimCheck) else ClaimCheck(setting)
        if not isinstance(spec.store, PayloadStore):
            raise ConfigurationError(
                "payload_store must have async put, get, delete and scan (PayloadStore)"
            )
        if spec.above < 1:
            raise ConfigurationError("ClaimCheck(above=...) must be at least 1 byte")
        self.store = spec.store
        self.above = spec.above
        self.prefix = prefix
        #: store key -> blob, for records built and not yet stored
        self.pending: dict[str, bytes] = {}
        #: the keys of the blobs this process's workers read, until their job completes
        self.fetched: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def dump(self, queue: str, job_id: str, data: bytes) -> bytes:
        """``data`` as a record holds it: a reference when it is over the threshold (the
        blob then waits in ``pending`` for ``flush``)."""
        if len(data) < self.above:
            return data
        key = job_key(self.prefix, queue, job_id)
        self.pending[key] = data
        return reference(key, data)

    async def flush(self, queue: str, ids: Iterable[str]) -> None:
        """Put the pending blobs of jobs ``ids`` of ``queue`` (before their records are
        stored: a worker never finds a record whose blob is not there yet)."""
        if not self.pending:
            return
        for job_id in ids:
            key = job_key(self.prefix, queue, job_id)
            blob = self.pending.pop(key, None)
            if blob is not None:
                await self.store.put(key, blob)

    def refuse_pending(self, queue: str, ids: Iterable[str]) -> None:
        """For the blocking producer (``app.sync()``), which cannot await the store: drop the
        blobs of the jobs just built, and refuse them if one had one."""
        dropped = [self.pending.pop(job_key(self.prefix, queue, i), None) for i in ids]
        if any(blob is not None for blob in dropped):
            from .exceptions import PayloadTooLarge

            raise PayloadTooLarge(
                f"the job's arguments reach the claim-check threshold ({self.above:,} bytes): "
                "the blocking producer cannot put them in the async payload store; enqueue "
                "it from asyncio"
            )

    async def fetch(self, queue: str, job_id: str) -> bytes | None:
        """A leased job's blob (None: the store has none), remembered for deletion once the
        job completes."""
        key = job_key(self.prefix, queue, job_id)
        blob = await self.store.get(key)
        if blob is not None:
            self.fetched.add(key)
        return blob

    def completed(self, queue: str, ids: Iterable[str]) -> None:
        """Delete (in the background) the blobs of jobs whose completion is stored."""
        keys = [k for k in (job_key(self.prefix, queue, i) for i in ids) if k in self.fetched]
        if not keys:
            return
        self.fetched.difference_update(keys)
        task = asyncio.get_running_loop().create_task(self._delete(keys))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def forget(self, queue: str, job_id: str) -> None:
        """A leased job that will not complete here (failed, released): keep its blob."""
        self.fetched.discard(job_key(self.prefix, queue, job_id))

    async def _delete(self, keys: Sequence[str]) -> None:
        try:
            await self.store.delete(keys)
        except Exception:  # the store's trouble: the blobs are left for sweep_payloads
            logger.warning("could not delete %d payload blobs", len(keys), exc_info=True)


async def put_blobs(claim: ClaimChecker | None, queue: str, ids: Iterable[str]) -> None:
    """Put the claim-checked payloads of jobs ``ids`` of ``queue`` in the payload store (the
    App's ``codec.claim``; None: no store), before their records are stored."""
    if claim is not None and claim.pending:
        await claim.flush(queue, ids)
