"""A ``backoff=`` that is not a ``Backoff`` is refused where it is given (issue 19 §6, met while
writing the docs' examples): ``@app.task(backoff=0.01)`` used to be accepted, then crash the job
wrapper at the task's first failure, leaving the job to wait for its lease."""

from __future__ import annotations

from typing import Any

import pytest

from aioqueue import App, Backoff, ConfigurationError


@pytest.mark.parametrize("bad", [0.01, 5, "1s", (1.0, 2.0)])
def test_a_backoff_that_is_not_a_backoff_is_refused_at_registration(bad: Any) -> None:
    app = App()
    with pytest.raises(ConfigurationError, match="backoff must be a Backoff"):

        @app.task(backoff=bad)
        async def t() -> None:
            return None

    assert "t" not in app.tasks
    with pytest.raises(ConfigurationError, match="backoff must be a Backoff"):
        App(backoff=bad)


def test_a_backoff_is_accepted() -> None:
    app = App(backoff=Backoff(base=0.5))

    @app.task(backoff=Backoff(base=0.01, jitter=0.0))
    async def t() -> None:
        return None

    @app.task
    async def u() -> None:
        return None

    assert t.backoff.base == 0.01
    assert u.backoff.base == 0.5  # the App's
