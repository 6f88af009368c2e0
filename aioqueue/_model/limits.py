"""Numbers the Lua scripts and the Python side must agree on.

Each is defined once per language: here, and in the block of shared limits at the top of
``lua/lib/core.lua``; ``tests/test_scripts.py`` checks that the two agree. Constants only: this
module imports nothing from aioqueue, so any module may import it.
"""

from __future__ import annotations

from typing import Final

#: the most jobs one script call moves at once (a claim leases, a reap recovers or promotes)
MAX_JOBS_PER_CALL: Final = 1000
#: the most leases one call gives back (release), and the most one call completes and leases
#: (complete_claim): the heaviest writers per job, so a smaller cap (I13)
MAX_ACKS_PER_CALL: Final = 500
#: values per leased job in claim's reply and in a parked worker's hand list
CLAIMED_JOB_VALUES: Final = 7
#: the range of priorities claim orders by (higher runs first)
MIN_PRIORITY: Final = -100
MAX_PRIORITY: Final = 100
#: the most entries each index of finished jobs (completed, cancelled) keeps: the newest
FINISHED_INDEX_MAX: Final = 100_000
#: the most durable steps one job records (``ctx.step``; step.lua)
MAX_STEPS_PER_JOB: Final = 1000
#: the most lines, and bytes, a job's log keeps (``ctx.log``; joblog.lua): the oldest go first
JOB_LOG_LINES: Final = 500
JOB_LOG_BYTES: Final = 65536
#: the maximum attempts of a record without field ``m`` (the App's default ``max_attempts``:
#: a new record stores ``m`` only when it differs, and never its attempts ``a`` while 0)
DEFAULT_MAX_ATTEMPTS: Final = 3
#: the retention (ms) of a dependent's end when a dependency failed, for a record without
#: field ``dt`` (the App's default ``dead_ttl``, 7 days: a waiting record stores ``dt`` only
#: when it differs)
DEFAULT_DEAD_TTL_MS: Final = 604_800_000
#: the tasks the backlog (``<base>backlog``) counts one by one; the rest together, as ``*``
BACKLOG_TASKS: Final = 100
