--[[ core: the keys, the limits shared with Python and the small helpers every script uses.
  Library part (not a script): the loader (aioqueue/_scripts.py, LIB) prepends the library
  parts a script needs, in a fixed order, each part using only parts before it.
  Needs: nothing (it comes first).

  Every transition script takes the same thirteen KEYS, in this order:
    KEYS[1] ready      KEYS[2] prio       KEYS[3] scheduled   KEYS[4] active
    KEYS[5] dead       KEYS[6] wake       KEYS[7] seq         KEYS[8] stats
    KEYS[9] qconf      KEYS[10] ring      KEYS[11] gactive    KEYS[12] gconf
    KEYS[13] gwait
  and ARGV[1] = the queue's key base ("<prefix>:{<queue>}:"), from which the keys of single jobs
  (base.."job:"..id), of groups' lanes (base.."g:"..group), of batches (base.."batch:"..bid)
  and of rate windows are built; they share the queue's hash tag, so every key a script
  touches lives in one cluster slot.

  A job hash has: t task, p payload, s state, a attempts, m max attempts, l lease token (kept
  after the job leaves active, so that an ack resent after a lost reply is recognised),
  pr priority (absent = 0), g group (absent = none), o options (JSON, absent = none),
  ct created ms, due due ms, r result, e error, f finished ms, pg progress, w set while someone
  awaits the result (the finishing script then publishes the id on the channel base.."done"),
  wk the worker that holds (or last held) its lease ('' a pull-API consumer), wn the lease's
  ordinal among that worker's leases, rf attempts refunded because a lost worker never started
  them, rl the last lease token that released it (a later fail/complete with it is stale), rc
  set while a recovered job waits to go back to the front of its lane (see recover_job).

  The worker registry (see lib/workers): base.."workers" ZSET worker id -> registration
  deadline (server ms; a worker that misses it is dead and gets buried); base.."worker:"..wid
  HASH its description and lease counters; base.."worker:"..wid..":jobs" SET the jobs leased
  to it. ]]
local K_READY, K_PRIO, K_SCHED, K_ACTIVE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_DEAD, K_WAKE, K_SEQ, K_STATS = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_QCONF, K_RING, K_GACTIVE, K_GCONF, K_GWAIT = KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local BASE = ARGV[1]

-- Limits shared with Python: aioqueue/_limits.py holds the same values, and
-- tests/test_scripts.py checks that the two agree (this block ends at the first blank line).
-- the most jobs one call moves at once (unpack() of their ids must stay within Lua's limits)
local MAX_JOBS_PER_CALL = 1000
-- values per leased job in claim's reply and in a parked worker's hand list
local CLAIMED_JOB_VALUES = 7
-- the priorities claim orders by (anything else is clamped into this range)
local MIN_PRIORITY = -100
local MAX_PRIORITY = 100

-- a number read from a record that anyone with write access could have garbled: nil, NaN and
-- infinities become the default
local function num(v, default)
  local n = tonumber(v)
  if not n or n ~= n or n == math.huge or n == -math.huge then return default end
  return n
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function job_key(id)
  return BASE .. 'job:' .. id
end

local function lane_key(g)
  return BASE .. 'g:' .. g
end

local function batch_key(bid) return BASE .. 'batch:' .. bid end

local K_WORKERS = BASE .. 'workers'
local function worker_key(wid) return BASE .. 'worker:' .. wid end
local function held_key(wid) return BASE .. 'worker:' .. wid .. ':jobs' end

-- a job left its worker's hands (finished, failed, released, recovered)
local function unhold(wid, ...)
  if wid and wid ~= '' then redis.call('SREM', held_key(wid), ...) end
end

-- leave one token in the wake list (never more), so that one blocked consumer wakes up
local function wake()
  if redis.call('LLEN', K_WAKE) == 0 then redis.call('RPUSH', K_WAKE, '1') end
end

-- announce a finished job (name: its id) or batch ('batch:'..bid) to whoever awaits it, if
-- someone registered (w); pcall: a user without channel rights (waiters then re-check on
-- their own) must still be able to finish jobs
local function announce(key, name)
  if redis.call('HDEL', key, 'w') == 1 then redis.pcall('PUBLISH', BASE .. 'done', name) end
end
