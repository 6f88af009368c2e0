"""The examples of typed arguments (``examples/typed_args.py``) and reservation handles
(``examples/review_handles.py``) run as documented, against the real server."""

from __future__ import annotations

import importlib
import sys
from decimal import Decimal
from typing import Any

import pytest

from .support.apps import unique_prefix


@pytest.fixture
def load_example(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh copy of ``examples.<name>`` under a unique prefix on this server."""

    def load(name: str) -> Any:
        monkeypatch.setenv("AIOQUEUE_REDIS_URL", redis_url)
        monkeypatch.setenv("EXAMPLE_PREFIX", unique_prefix())
        sys.modules.pop(f"examples.{name}", None)
        return importlib.import_module(f"examples.{name}")

    return load


async def test_the_typed_arguments_example(load_example: Any) -> None:
    example = load_example("typed_args")
    paid = await example.main()
    assert [p.status for p in paid] == [example.Status.PAID] * 2
    assert [p.total for p in paid] == [Decimal("99.90"), Decimal("0.10")]
    assert all(isinstance(p, example.Invoice) for p in paid)


async def test_the_review_handles_example(load_example: Any) -> None:
    example = load_example("review_handles")
    result, codes = await example.main()
    assert codes == [200, 400, 200]
    assert result == {"approved": True}
