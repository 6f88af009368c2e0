"""Compression of stored payloads and results above a size threshold (``App(compression=...)``).

A compressed value is ``MARKER`` (``\\x00aqz1``) | codec id (1 byte) | original length (8 bytes,
big-endian) | the codec's frame. Values under the threshold, and values the codec does not make
smaller, are stored as they are. A reader decodes by the marker, whatever its own setting, and
never inflates more than its cap (``max_decompressed_bytes``): a planted frame that claims or
yields more is refused before it is held in memory. The codecs live in an extra
(``aioqueue[compression]``: zstandard; ``lz4`` on request); a reader without the one a value
needs refuses it with a typed reason (``CompressionUnavailable``), never garbage.

Compression comes first, then encryption, then the MAC: ciphertext does not compress.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .exceptions import ConfigurationError

MARKER = b"\x00aqz1"
_HEAD = len(MARKER) + 1 + 8
#: the codecs by name and by the id byte stored with each value
_IDS = {"zstd": b"z", "lz4": b"4"}
_NAMES = {v: k for k, v in _IDS.items()}
_EXTRA = {"zstd": "pip install 'aioqueue[compression]'", "lz4": "pip install lz4"}
#: the default threshold: values under 1 KiB are stored as they are
DEFAULT_ABOVE = 1024


class CompressionError(Exception):
    """A compressed value that cannot be read here: ``kind`` names why (the reason a job is
    dead-lettered under): ``CompressionUnavailable``, ``DecompressionBomb`` or
    ``CorruptPayload``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Compression:
    """``App(compression=Compression("zstd", above=4096, level=3))``: the codec, the size in
    bytes from which values are compressed, and the codec's level (None: its default)."""

    codec: str = "zstd"
    above: int = DEFAULT_ABOVE
    level: int | None = None


def _zstd(level: int | None) -> tuple[Callable[[bytes], bytes], Any]:
    import zstandard

    return zstandard.ZstdCompressor(level=3 if level is None else level).compress, zstandard


def _lz4(level: int | None) -> tuple[Callable[[bytes], bytes], Any]:
    import lz4.frame

    return (lambda data: lz4.frame.compress(data, compression_level=level or 0)), lz4.frame


def _module(name: str) -> Any:
    try:
        return (_zstd if name == "zstd" else _lz4)(None)[1]
    except ImportError:
        raise CompressionError(
            "CompressionUnavailable",
            f"the value is compressed with {name}, which is not installed here: {_EXTRA[name]}",
        ) from None


class Compressor:
    """Compresses values over ``above`` bytes with one codec; reads any compressed value.

    Args:
        setting: ``"zstd"``, ``"lz4"``, a Compression, or None (write uncompressed).
        cap: the largest decompressed size read (0: no cap).
    """

    __slots__ = ("_compress", "above", "cap", "codec")

    def __init__(self, setting: str | Compression | None, cap: int) -> None:
        spec = Compression(setting) if isinstance(setting, str) else setting
        self.cap = cap
        self.codec = "" if spec is None else spec.codec
        self.above = 0 if spec is None else spec.above
        self._compress: Callable[[bytes], bytes] | None = None
        if spec is None:
            return
        if spec.codec not in _IDS:
            raise ConfigurationError(f"compression must be 'zstd' or 'lz4', not {spec.codec!r}")
        if spec.above < 0:
            raise ConfigurationError("Compression(above=...) must be 0 or more bytes")
        try:
            self._compress = (_zstd if spec.codec == "zstd" else _lz4)(spec.level)[0]
        except ImportError:
            raise ConfigurationError(
                f"compression={spec.codec!r} needs its codec: {_EXTRA[spec.codec]}"
            ) from None

    def compress(self, data: bytes) -> bytes:
        """``data`` as stored: compressed when it is over the threshold and that helps."""
        if self._compress is None or len(data) < self.above:
            return data
        packed = self._compress(data)
        if len(packed) + _HEAD >= len(data):
            return data
        return MARKER + _IDS[self.codec] + len(data).to_bytes(8, "big") + packed

    def decompress(self, data: bytes) -> bytes:
        """A stored value as it was before ``compress`` (as it is when not compressed).

        Raises:
            CompressionError: its codec is not installed here, it would inflate past the cap
                (``DecompressionBomb``), or it is not a valid frame (``CorruptPayload``).
        """
        if not data.startswith(MARKER):
            return data
        if len(data) < _HEAD or data[len(MARKER) : len(MARKER) + 1] not in _NAMES:
            raise CompressionError("CorruptPayload", "an unknown compressed format")
        name = _NAMES[data[len(MARKER) : len(MARKER) + 1]]
        size = int.from_bytes(data[len(MARKER) + 1 : _HEAD], "big")
        if self.cap and size > self.cap:
            raise CompressionError("DecompressionBomb", self._bomb(size))
        module = _module(name)
        limit = size + 1  # read one byte more than declared: a frame that lies is caught
        try:
            if name == "zstd":
                with module.ZstdDecompressor().stream_reader(io.BytesIO(data[_HEAD:])) as r:
                    out = _read_at_most(r, limit)
            else:
                out = module.LZ4FrameDecompressor().decompress(data[_HEAD:], max_length=limit)
        except Exception as exc:
            raise CompressionError("CorruptPayload", f"cannot decompress: {exc!r}") from None
        if len(out) != size:
            raise CompressionError(
                "CorruptPayload",
                f"decompressed to other than the {size:,} bytes its header declares",
            )
        return bytes(out)

    def _bomb(self, size: int) -> str:
        return (
            f"the value would decompress to {size:,} bytes, over the cap of {self.cap:,} "
            "(App(max_payload_bytes=...) sets it: 8 times that)"
        )


def _read_at_most(reader: Any, limit: int) -> bytes:
    """Up to ``limit`` bytes from a stream, read in pieces (never more held at once)."""
    parts: list[bytes] = []
    got = 0
    while got < limit:
        piece = reader.read(min(1 << 20, limit - got))
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
    return b"".join(parts)


def decompressed_cap(max_payload_bytes: int) -> int:
    """The default cap on a decompressed value: 8 times ``max_payload_bytes``, at least
    64 MiB (0, no payload limit: 256 MiB)."""
    if not max_payload_bytes:
        return 256 << 20
    return max(8 * max_payload_bytes, 64 << 20)
