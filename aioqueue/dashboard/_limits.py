"""The named limiters' page (``/limiters``, docs/flow-control.md): each limiter the App
declares with its settings, what one key of it holds now (tokens, next admission, running
holders, jobs waiting aside) and, for an admin, a form that changes it at run time for every
worker (``app.limiters.set``) or puts it back to its declared settings."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from aioqueue._app.limiters import Limiter, LimiterState
from aioqueue._model.checks import check_name
from aioqueue._model.exceptions import ConfigurationError
from aioqueue.dashboard import _data
from aioqueue.dashboard._page import dash, forbidden, may_post, one, page


def _row(lim: Limiter) -> dict[str, Any]:
    rate = "-" if lim.rate is None else f"{lim.rate[0]} per {lim.rate[1]:g} s"
    return {
        "name": lim.name,
        "rate": rate,
        "burst": lim.burst,
        "concurrency": "-" if lim.concurrency is None else lim.concurrency,
        "keyed": lim.key is not None,
    }


def _state(st: LimiterState) -> dict[str, Any]:
    return {
        "key": st.key,
        "tokens": "-" if st.tokens is None else st.tokens,
        "next": "now" if st.next_admit_ms <= st.now_ms else _data.when(st.next_admit_ms),
        "holders": st.holders,
        "waiting": st.waiting,
        "overrides": ", ".join(f"{k}={v}" for k, v in sorted(st.overrides.items())) or "none",
    }


def _number(form: dict[str, list[str]], name: str, kind: type[int] | type[float]) -> Any:
    raw = one(form, name)
    if raw is None or not raw.strip():
        return None
    try:
        return kind(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a number, not {raw[:40]!r}") from None


@page
async def limiters(request: Request) -> Response:
    """GET: the declared limiters, and the state of ``name``'s key ``key`` (on ``queue``);
    POST (admin): change ``name``'s rate, burst or concurrency, or ``reset`` it."""
    d = dash(request)
    declared = d.app.limiters
    base = request.scope.get("root_path", "")
    if request.method == "POST":
        if not d.can_act(request):
            return forbidden("the dashboard is read-only for this user")
        form, refused = await may_post(request)
        if refused is not None:
            return refused
        name = one(form, "name") or ""
        if name not in declared:
            raise ConfigurationError(f"no limiter named {name[:200]!r} is declared")
        queue = one(form, "queue") or None
        where = None if queue is None else check_name("queue name", queue)
        if one(form, "reset") == "1":  # back to the declared settings, nothing else
            await declared.set(name, reset=True, queue=where)
        else:
            n, per = _number(form, "rate_n", int), _number(form, "rate_s", float)
            await declared.set(
                name,
                rate=None if n is None or per is None else (n, per),
                burst=_number(form, "burst", int),
                concurrency=_number(form, "concurrency", int),
                queue=where,
            )
        query = {"name": name, "key": one(form, "key") or "", "msg": f"{name}: changed"}
        return RedirectResponse(f"{base}/limiters?{urlencode(query)}", status_code=303)
    name = request.query_params.get("name", "")
    key = request.query_params.get("key", "")
    queue = request.query_params.get("queue") or None
    shown = None
    if name in declared:
        q = None if queue is None else check_name("queue name", queue)
        shown = _state(await declared.state(name, key, queue=q))
    ctx = {
        "limiters": [_row(lim) for lim in declared.values()],
        "name": name,
        "key": key,
        "queue": queue or "",
        "shown": shown,
        "msg": request.query_params.get("msg", ""),
        "can_act": d.can_act(request),
    }
    return d.render(request, "limiters.html", ctx)
