"""Two payload stores for ``App(payload_store=...)`` (docs/tasks.md, "Large payloads"): one in
memory (tests, one process) and one on a file system (a directory every worker and producer
mounts). A store for S3, GCS or a database has the same four coroutines."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote, unquote


class MemoryStore:
    """Blobs in a dict: for tests, and for producers and workers in one process."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    async def put(self, key: str, data: bytes) -> None:
        self.blobs[key] = data

    async def get(self, key: str) -> bytes | None:
        return self.blobs.get(key)

    async def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.blobs.pop(key, None)

    async def scan(self, prefix: str, cursor: str, limit: int) -> tuple[list[str], str]:
        keys = sorted(k for k in self.blobs if k.startswith(prefix) and k > cursor)[:limit]
        return keys, (keys[-1] if len(keys) == limit else "")


class FileStore:
    """One file per blob under ``root`` (its name: the key, percent-encoded), written to a
    temporary name then renamed, so a reader never sees half a blob. File I/O runs in a
    thread."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / quote(key, safe="")

    def _put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)

    def _get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def _delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)

    def _scan(self, prefix: str, cursor: str, limit: int) -> tuple[list[str], str]:
        names = (unquote(e.name) for e in os.scandir(self.root) if not e.name.startswith("."))
        keys = sorted(k for k in names if k.startswith(prefix) and k > cursor)[:limit]
        return keys, (keys[-1] if len(keys) == limit else "")

    async def put(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self._put, key, data)

    async def get(self, key: str) -> bytes | None:
        return await asyncio.to_thread(self._get, key)

    async def delete(self, keys: Sequence[str]) -> None:
        await asyncio.to_thread(self._delete, keys)

    async def scan(self, prefix: str, cursor: str, limit: int) -> tuple[list[str], str]:
        return await asyncio.to_thread(self._scan, prefix, cursor, limit)
