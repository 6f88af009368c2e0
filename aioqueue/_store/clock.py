"""The virtual clock of the testing kit (docs/testing.md): the one place where the time the
scripts and Python read from the server can be shifted, and only in test mode.

Every script reads the time through ``now_ms()`` in ``lua/lib/core.lua``, and Python reads it
through ``server_time`` (``_cluster``). An App made with ``App(..., testing=True)`` marks its
client (``use_virtual_clock``) and then runs the *test build* of the scripts, in which
``now_ms()`` adds the offset stored in the queue's key ``<prefix>:{<queue>}:testclock`` (ms,
set by ``aioqueue.testing.VirtualClock``), and its reads of the server's time add the same
offset. Every other App runs the production build, whose ``now_ms()`` reads no key: a
planted ``testclock`` key shifts nothing there (docs/security.md), and the production scripts
cost what they cost before the clock existed.
"""

from __future__ import annotations

from typing import Any

#: the line of core.lua's ``now_ms()`` that the test build replaces
PRODUCTION_NOW = "  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
#: its test build: plus the offset, the queue's own, else its prefix's (``<prefix>:testclock``:
#: a prefix holds no ':'; read on a standalone server, an error taken as none on a cluster,
#: where that key is in another slot); a garbled key, or one of another type: 0
TEST_NOW = (
    "  local shift = redis.pcall('GET', BASE .. 'testclock')\n"
    "  if not shift then\n"
    "    shift = redis.pcall('GET', string.match(BASE, '^[^:]*') .. ':testclock')\n"
    "  end\n"
    "  shift = num(shift, 0)\n"
    "  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + math.floor(shift)\n"
)

#: what ``server_time`` sends in test mode, KEYS[1] a queue's ``testclock`` key: the server's
#: clock plus the offset, in TIME's reply shape {seconds, microseconds}
SHIFTED_TIME = """local t = redis.call('TIME')
local shift = redis.pcall('GET', KEYS[1])
if not shift then shift = redis.pcall('GET', string.match(KEYS[1], '^[^:]*') .. ':testclock') end
shift = tonumber(shift)
if not shift or shift ~= shift or shift == math.huge or shift == -math.huge then shift = 0 end
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + math.floor(shift)
return {math.floor(ms / 1000), (ms % 1000) * 1000}"""


def virtual_build(core: str) -> str:
    """core.lua's source with the test build of ``now_ms()``."""
    if core.count(PRODUCTION_NOW) != 1:
        raise RuntimeError("lua/lib/core.lua: now_ms() is not where the virtual clock expects it")
    return core.replace(PRODUCTION_NOW, TEST_NOW)


def _holder(client: Any) -> Any:
    """Where a client's aioqueue settings live: its pool (None for a cluster: the client)."""
    pool = getattr(client, "connection_pool", None)
    return client if pool is None else pool


def use_virtual_clock(client: Any) -> None:
    """Run this client's script calls with the test build and shift its reads of the time."""
    _holder(client).aioqueue_test_clock = True


def virtual_clock_on(client: Any) -> bool:
    """Whether ``client`` is in test mode (``use_virtual_clock``)."""
    return bool(getattr(_holder(client), "aioqueue_test_clock", False))
