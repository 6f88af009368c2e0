"""Which compression codec for ``App(compression=...)``: speed and ratio of the candidates on
PyPI, on JSON job arguments of 1 KB, 100 KB and 5 MB, repetitive and less repetitive.

Run: ``.venv/bin/python benchmarks/codecs.py`` (with the candidates installed; a missing one is
skipped). Prints one row per codec, payload and kind: ratio, compress and decompress MB/s.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable

Codec = tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]


def candidates() -> dict[str, Codec]:
    found: dict[str, Codec] = {}
    import zlib

    found["zlib-1"] = (lambda d: zlib.compress(d, 1), zlib.decompress)
    try:
        import zstandard

        c, d = zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor()
        found["zstandard-3"] = (c.compress, d.decompress)
    except ImportError:
        pass
    try:
        import lz4.frame

        found["lz4-frame"] = (lz4.frame.compress, lz4.frame.decompress)
    except ImportError:
        pass
    try:
        import cramjam

        found["cramjam-zstd"] = (
            lambda b: bytes(cramjam.zstd.compress(b)),
            lambda b: bytes(cramjam.zstd.decompress(b)),
        )
        found["cramjam-snappy"] = (
            lambda b: bytes(cramjam.snappy.compress_raw(b)),
            lambda b: bytes(cramjam.snappy.decompress_raw(b)),
        )
    except ImportError:
        pass
    try:
        import brotli

        found["brotli-1"] = (lambda b: brotli.compress(b, quality=1), brotli.decompress)
    except ImportError:
        pass
    return found


def payload(size: int, repetitive: bool, seed: int = 7) -> bytes:
    """JSON ``[args, kwargs]`` of about ``size`` bytes: records of an order-like shape
    (repetitive), or random words and numbers (less repetitive)."""
    rnd = random.Random(seed)
    words = [
        "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(3, 10)))
        for _ in range(5000 if not repetitive else 50)
    ]
    rows: list[object] = []
    total = 20
    while total < size:
        if repetitive:
            row: object = {
                "sku": rnd.choice(words),
                "qty": rnd.randint(1, 9),
                "status": "pending",
                "warehouse": "eu-west-1",
                "price": round(rnd.uniform(1, 99), 2),
            }
        else:
            row = {
                "id": rnd.getrandbits(64),
                "text": " ".join(rnd.sample(words, 8)),
                "score": rnd.random(),
                "tag": rnd.choice(words),
            }
        rows.append(row)
        total += len(json.dumps(row, separators=(",", ":"))) + 1
    return json.dumps([[rows], {}], separators=(",", ":")).encode()


def measure(fn: Callable[[bytes], bytes], data: bytes) -> float:
    """Seconds per call (best of a few runs, at least ~50 ms each)."""
    n = max(1, 5_000_000 // max(len(data), 1))
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            fn(data)
        best = min(best, (time.perf_counter() - t) / n)
    return best


def main() -> None:
    codecs = candidates()
    print(f"{'codec':15} {'payload':>16} {'ratio':>7} {'comp MB/s':>10} {'decomp MB/s':>12}")
    for size in (1_000, 100_000, 5_000_000):
        for repetitive in (True, False):
            data = payload(size, repetitive)
            label = f"{len(data) / 1000:.0f} KB {'rep' if repetitive else 'mixed'}"
            for name, (comp, decomp) in codecs.items():
                packed = comp(data)
                assert decomp(packed) == data
                tc, td = measure(comp, data), measure(decomp, packed)
                print(
                    f"{name:15} {label:>16} {len(data) / len(packed):7.2f} "
                    f"{len(data) / tc / 1e6:10.0f} {len(data) / td / 1e6:12.0f}"
                )


if __name__ == "__main__":
    main()
