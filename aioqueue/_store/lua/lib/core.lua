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
  set while a recovered job waits to go back to the front of its lane (see recover_job), st
  when the current or last attempt was leased, hx the attempts that ended other than by
  success (see lib/history), xk set once the job has step results or a log (extras_of).

  The worker registry (see lib/workers): base.."workers" ZSET worker id -> registration
  deadline (server ms; a worker that misses it is dead and gets buried); base.."worker:"..wid
  HASH its description and lease counters; base.."worker:"..wid..":jobs" SET the jobs leased
  to it.

  Garbage in the keyspace (I9): every command on a key goes through call(), which repairs what
  would make it fail, so no script stops midway after a destructive move. A key of the wrong
  type, or a counter that is not an integer, is renamed aside to <key>..":garbled:"..<ms>; a
  hash field that is not an integer (a count in stats or gactive) is moved to such a key and
  dropped from its hash. Each is listed in base.."garbled" (HASH: aside key -> JSON {key,
  reason, at}) and counted in stats (garbled); then the command runs again on the fresh key.
  A job id that is not UTF-8 is dead-lettered (Garbled) when a claim meets it (utf8_ok). ]]
local K_READY, K_PRIO, K_SCHED, K_ACTIVE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_DEAD, K_WAKE, K_SEQ, K_STATS = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_QCONF, K_RING, K_GACTIVE, K_GCONF, K_GWAIT = KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local BASE = ARGV[1]

-- Limits shared with Python: aioqueue/_limits.py holds the same values, and
-- tests/test_scripts.py checks that the two agree (this block ends at the first blank line).
-- the most jobs one call moves at once (unpack() of their ids must stay within Lua's limits)
local MAX_JOBS_PER_CALL = 1000
-- the most leases one call gives back (release), and completes and leases (complete_claim)
local MAX_ACKS_PER_CALL = 500
-- values per leased job in claim's reply and in a parked worker's hand list
local CLAIMED_JOB_VALUES = 7
-- the priorities claim orders by (anything else is clamped into this range)
local MIN_PRIORITY = -100
local MAX_PRIORITY = 100
-- the most entries each index of finished jobs (completed, cancelled) keeps, the newest
local FINISHED_INDEX_MAX = 100000
-- the most durable steps one job records (step.lua)
local MAX_STEPS_PER_JOB = 1000
-- the most lines, and bytes, a job's log keeps: the oldest are dropped (joblog.lua)
local JOB_LOG_LINES = 500
local JOB_LOG_BYTES = 65536
-- the maximum attempts a record without field m has (the App's default max_attempts)
local DEFAULT_MAX_ATTEMPTS = 3
-- the retention (ms) of a dependent's end when a dependency failed, for a record without dt
-- (the App's default dead_ttl, 7 days)
local DEFAULT_DEAD_TTL_MS = 604800000
-- the tasks the backlog counts one by one (base.."backlog"; the rest together, field '*')
local BACKLOG_TASKS = 100

-- a number read from a record that anyone with write access could have garbled: nil, NaN and
-- infinities become the default
local function num(v, default)
  local n = tonumber(v)
  if not n or n ~= n or n == math.huge or n == -math.huge then return default end
  return n
end

-- the largest value a counter may hold: Lua numbers are doubles, exact up to 2^53, so a counter
-- past it (or one about to overflow the server's 64 bits) would be read back wrong
local MAX_COUNT = 9007199254740991

-- a count read from a key or a hash field: an integer string within 0..MAX_COUNT (absent: 0);
-- nil for anything else (a float, "1e400", "nan", a negative or out-of-range integer), which
-- the reader takes as unknown and the next guarded increment of it sets aside (see call)
local function count_of(v)
  if not v then return 0 end
  if #v > 16 or not string.find(v, '^%d+$') then return nil end
  local n = tonumber(v)
  if n > MAX_COUNT then return nil end
  return n
end

-- REC.attempts: a job's attempts and maximum attempts (fields a and m, as read): absent, they are 0 and
-- DEFAULT_MAX_ATTEMPTS (a new record stores neither: see REC.new); attempts that are
-- garbage restart at 0 (the job runs again rather than being lost), a maximum that is garbage is 1
-- (REC: one table, not locals: a script has at most 200 locals, and the library is at it)
local REC = {}
function REC.attempts(a, m)
  if not m then return count_of(a) or 0, DEFAULT_MAX_ATTEMPTS end
  return count_of(a) or 0, math.max(1, count_of(m) or 1)
end

-- REC.new: the first fields of a new job record (HSET arguments, the payload at [4]): task, payload and
-- creation time, and the maximum attempts m unless it is DEFAULT_MAX_ATTEMPTS; its attempts a
-- (0) are not stored either. A plain record is 10 bytes smaller so, which takes its listpack
-- into the allocator's next smaller size class (docs/benchmarks.md, bytes per queued job)
function REC.new(task, payload, m, now)
  local f = {'t', task, 'p', payload, 'ct', now}
  if tonumber(m) ~= DEFAULT_MAX_ATTEMPTS then f[7] = 'm'; f[8] = m end
  return f
end

-- refuse a call that names more than cap (default MAX_JOBS_PER_CALL) jobs (I13: a script's
-- work is bounded by constants, never by its caller), before any write
local function check_count(n, cap)
  cap = cap or MAX_JOBS_PER_CALL
  if n > cap then error('aioqueue: at most ' .. cap .. ' jobs a call, not ' .. n, 0) end
end

-- the server's clock in ms: the ONE place every script reads the time (never TIME
-- elsewhere). An App made with testing=True runs a test build of the scripts in which it
-- adds the virtual clock's offset (see aioqueue/_store/clock.py; tests/test_clock.py checks
-- that no script reads TIME but here)
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- ---------------------------------------------------------------- garbage (I9), see above
local K_GARBLED = BASE .. 'garbled'

-- a free key name for what was garbled in key
local function aside_name(key, now)
  local to = key .. ':garbled:' .. now
  local n = 0
  while redis.call('EXISTS', to) == 1 do
    n = n + 1
    to = key .. ':garbled:' .. now .. '.' .. n
  end
  return to
end

-- record a quarantined key (aside: where it went) with the reason; the record itself never
-- fails: a record hash or stats of the wrong type is set aside in turn
local function note_garbled(aside, key, reason, now)
  local rec = cjson.encode({key = key, reason = reason, at = now})
  if type(redis.pcall('HSET', K_GARBLED, aside, rec)) == 'table' then
    local to = aside_name(K_GARBLED, now)
    redis.call('RENAME', K_GARBLED, to)
    redis.call('HSET', K_GARBLED, aside, rec,
      to, cjson.encode({key = K_GARBLED, reason = 'not a hash', at = now}))
  end
  local n = redis.pcall('HINCRBY', K_STATS, 'garbled', 1)
  if type(n) == 'number' and (n > MAX_COUNT or n < 1) then
    redis.call('HINCRBY', K_STATS, 'garbled', -1)
    n = {err = 'out of range'}
  end
  if type(n) == 'table' and redis.call('TYPE', K_STATS).ok == 'hash' then
    -- the count of garbled keys is garbage itself (not an integer, at the limit): restarted
    local to = aside_name(K_STATS .. ':garbled', now)
    redis.call('SET', to, 'garbled=' .. tostring(redis.call('HGET', K_STATS, 'garbled')))
    redis.call('HSET', K_GARBLED, to,
      cjson.encode({key = K_STATS, reason = 'field garbled', at = now}))
    redis.call('HSET', K_STATS, 'garbled', 2)
  elseif type(n) == 'table' then
    local to = aside_name(K_STATS, now)
    redis.call('RENAME', K_STATS, to)
    redis.call('HSET', K_GARBLED, to, cjson.encode({key = K_STATS, reason = 'garbled', at = now}))
    redis.call('HINCRBY', K_STATS, 'garbled', 2)
  end
end

-- rename a garbled key aside, keeping what it held for inspection
local function set_aside(key, reason)
  local now = now_ms()
  local to = aside_name(key, now)
  redis.call('RENAME', key, to)
  note_garbled(to, key, reason, now)
end

-- move a hash field that holds garbage aside (as a string "field=value"), drop it, and list it
local function field_aside(key, field, why)
  local now = now_ms()
  local to = aside_name(key .. ':' .. field, now)
  redis.call('SET', to, field .. '=' .. tostring(redis.call('HGET', key, field)))
  redis.call('HDEL', key, field)
  note_garbled(to, key, 'field ' .. field .. ' ' .. why, now)
end

-- the increments call() guards: their increment's position among the arguments after the key
-- (INCR: 1 implied)
local INCREMENTS = {INCR = 0, INCRBY = 1, HINCRBY = 2}

-- why an increment's error means its counter is garbage (nil: another error)
local function count_error(msg)
  if string.find(msg, 'not an integer', 1, true) then return 'not an integer' end
  if string.find(msg, 'would overflow', 1, true) then return 'increment would overflow' end
  if string.find(msg, 'count out of range', 1, true) then return 'out of range' end
  return nil
end

-- put things right so that cmd on key can run again, or raise err: a key of the wrong type or
-- a counter that is not an integer within 0..MAX_COUNT is set aside; such a count in a hash
-- field is moved aside (as a string "field=value") and dropped
local function repair(err, cmd, key, field)
  local msg = err.err or tostring(err)
  local bad = INCREMENTS[cmd] and count_error(msg)
  if string.find(msg, 'WRONGTYPE', 1, true) then
    set_aside(key, 'wrong type for ' .. cmd .. ': ' .. redis.call('TYPE', key).ok)
  elseif bad and cmd == 'HINCRBY' then
    field_aside(key, field, bad)
  elseif bad then
    set_aside(key, bad)
  elseif cmd == 'XADD' then
    -- a stream that refuses new entries (its last id planted at the end of the id space)
    set_aside(key, 'refused XADD: ' .. msg)
  else
    error(err)
  end
  -- lease tokens and turns keep growing past every one handed out before
  if key == K_SEQ then redis.call('SET', K_SEQ, now_ms() * 1000) end
  -- a ring set aside held the turns of the lanes with work: the default lane rejoins here,
  -- a group's lane when a job of it is pushed or its slot is freed
  if key == K_RING and (redis.pcall('LLEN', K_READY) ~= 0 or redis.pcall('ZCARD', K_PRIO) ~= 0) then
    redis.call('ZADD', K_RING, 0, '')
  end
end

-- an increment that succeeded on a counter that was garbage all the same (negative before it,
-- or past MAX_COUNT after it: "-1", "9007199254740993"): undone, so that what is set aside is
-- what was found; returns the error repair() takes, or nil when the counter was sane
local function out_of_range(r, cmd, key, ...)
  local args = {...}
  local by = 1
  if INCREMENTS[cmd] > 0 then by = tonumber(args[INCREMENTS[cmd]]) end
  if r <= MAX_COUNT and r - by >= 0 then return nil end
  if cmd == 'HINCRBY' then redis.call('HINCRBY', key, args[1], -by)
  else redis.call('INCRBY', key, -by) end
  return {err = 'ERR count out of range 0..' .. MAX_COUNT}
end

-- redis.call on a key, repaired once if the key's type or value is garbage (see above); an
-- increment (INCREMENTS) is guarded: its counter must be an integer within 0..MAX_COUNT before
-- and after it, else the counter is set aside and counting restarts
local function call(cmd, key, ...)
  local r = redis.pcall(cmd, key, ...)
  if type(r) == 'table' and r.err then
    repair(r, cmd, key, ...)
    return redis.call(cmd, key, ...)
  end
  if INCREMENTS[cmd] then
    local bad = out_of_range(r, cmd, key, ...)
    if bad then
      repair(bad, cmd, key, ...)
      return redis.call(cmd, key, ...)
    end
  end
  return r
end

-- a job id that Python can read back (strict UTF-8: no overlong forms, no surrogates)
local function utf8_ok(s)
  if not string.find(s, '[\128-\255]') then return true end
  local i, n = 1, #s
  while i <= n do
    local c = string.byte(s, i)
    local len, lo, hi = 1, 128, 191
    if c < 128 then len = 1
    elseif c >= 194 and c <= 223 then len = 2
    elseif c >= 224 and c <= 239 then
      len = 3
      if c == 224 then lo = 160 elseif c == 237 then hi = 159 end
    elseif c >= 240 and c <= 244 then
      len = 4
      if c == 240 then lo = 144 elseif c == 244 then hi = 143 end
    else return false end
    for j = i + 1, i + len - 1 do
      local b = string.byte(s, j)
      if not b or b < lo or b > hi then return false end
      lo, hi = 128, 191
    end
    i = i + len
  end
  return true
end

local function job_key(id)
  return BASE .. 'job:' .. id
end

-- the keys that live and die with a job's record (I8): its durable steps' results (HASH,
-- step.lua), its log (LIST, joblog.lua) and the results of its dependencies kept for it (HASH,
-- lib/deps: member -> result as stored). The scripts that write them mark the record with
-- xk, so that the scripts that expire or delete a record touch them only when they exist
local function extras_of(id)
  return BASE .. 'step:' .. id, BASE .. 'log:' .. id, BASE .. 'depres:' .. id
end

-- make a record's extras (xk: its field) follow it: ttl ms > 0 expire with it, 0 deleted
-- with it, -1 kept for good with it (a record given back its life: requeue). xk 'r': only
-- the results of its dependencies can exist (a dependent's record is stored with it, lib/deps);
-- anything else: any of the three
local function follow_record(id, xk, ttl)
  if not xk then return end
  local sk, lk, rk = extras_of(id)
  local keys = {sk, lk, rk}
  if xk == 'r' then keys = {rk} end
  if ttl == 0 then
    call('DEL', unpack(keys))
    return
  end
  for _, k in ipairs(keys) do
    if ttl > 0 then call('PEXPIRE', k, ttl) else call('PERSIST', k) end
  end
end

-- the step hash of job id whose record was created at ct (its field ct), and whether it holds
-- anything: a hash marked with another ct belongs to an earlier job of that id, whose record
-- went behind the scripts' back, and is dropped before anything is read from it (I8)
local function steps_of(id, ct)
  local sk = extras_of(id)
  local mark = call('HGET', sk, 'ct')
  if mark == (ct or '') then return sk, true end
  if mark then call('DEL', sk) end
  return sk, false
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
  if wid and wid ~= '' then call('SREM', held_key(wid), ...) end
end

-- leave one token in the wake list (never more), so that one blocked consumer wakes up
local function wake()
  if call('LLEN', K_WAKE) == 0 then call('RPUSH', K_WAKE, '1') end
end

-- announce a finished job (name: its id) or batch ('batch:'..bid) to whoever awaits it, if
-- someone registered (w); pcall: a user without channel rights (waiters then re-check on
-- their own) must still be able to finish jobs. Sharded first (SPUBLISH: on a cluster the
-- waiters listen on the node that serves the queue's slot, and nothing crosses the cluster
-- bus); when no sharded listener got it (standalone waiters, a server without SPUBLISH),
-- plain PUBLISH
local function announce(key, name)
  if call('HDEL', key, 'w') == 1 then
    local got = redis.pcall('SPUBLISH', BASE .. 'done', name)
    if type(got) ~= 'number' or got == 0 then redis.pcall('PUBLISH', BASE .. 'done', name) end
  end
end

-- a unique job's lock (uk: its scope letter, ':', its key; absent for none and for scope ttl,
-- which only its TTL ends) is freed when the job leaves the states the scope covers; only if
-- the lock still names this job (it may have run out and been taken by another since)
local function unlock(id, uk)
  if not uk then return end
  local key = BASE .. 'unique:' .. string.sub(uk, 3)
  if call('GET', key) == id then call('DEL', key) end
end

-- the indexes of finished jobs, for listing them: ZSETs job id -> finish time (server ms),
-- written by the scripts that complete or cancel a job, each trimmed to its newest
-- FINISHED_INDEX_MAX entries. An entry whose record has expired stays until trimmed (a
-- listing skips it)
local K_COMPLETED, K_CANCELLED = BASE .. 'completed', BASE .. 'cancelled'

-- add ids (at most MAX_JOBS_PER_CALL), finished at now, to index key, and trim it
local function index_finished(key, now, ids)
  if #ids == 0 then return end
  local args = {}
  for i, id in ipairs(ids) do
    args[2 * i - 1] = now
    args[2 * i] = id
  end
  call('ZADD', key, unpack(args))
  if call('ZCARD', key) > FINISHED_INDEX_MAX then
    call('ZREMRANGEBYRANK', key, 0, -FINISHED_INDEX_MAX - 1)
  end
end

-- renew the leases of n active jobs to now + lease, fenced by their tokens (ids and tokens are
-- ARGV[at], ARGV[at + 1], ...): appends a code per job to out (1 renewed, -1 no such job, -2
-- token mismatch, -3 renewed but cancellation was requested), and wakes an idle consumer when
-- a renewed lease ends before every other one, so it re-arms its wake-up (extend, beat)
local function renew_leases(out, lease, now, at, n)
  local first = call('ZRANGE', K_ACTIVE, 0, 0, 'WITHSCORES')
  local earliest = tonumber(first[2])
  check_count(n)
  for i = 0, n - 1 do
    local id, tok = ARGV[at + i * 2], ARGV[at + 1 + i * 2]
    local r = call('HMGET', job_key(id), 's', 'l', 'x')
    if not r[1] then
      out[#out + 1] = -1
    elseif r[1] ~= 'active' or r[2] ~= tok then
      out[#out + 1] = -2
    else
      call('ZADD', K_ACTIVE, 'XX', now + lease, id)
      if r[3] then out[#out + 1] = -3 else out[#out + 1] = 1 end
    end
  end
  if earliest and now + lease < earliest then wake() end
end

-- ------------------------------------------------------------------ the backlog count
--[[ base.."backlog" HASH: the queue's queued jobs, counted exactly by the scripts that move a
  job into or out of the counted states: a record in state queued (ready in any lane, the
  default, priority or a group's; or waiting aside on a limiter) or scheduled (delayed, a
  retry's backoff, a durable wait's timeout). Not counted: waiting (for dependencies, a batch's
  callback: released by other jobs' outcomes, never by a producer), active and the ends.
  Field 't:'..task -> its count (a count that falls to 0 is dropped); at most BACKLOG_TASKS
  such fields, later tasks counted in '*'; the total is the sum (backlog_total). A decrement
  that finds less in its task's field takes the rest from '*' (the task was counted there
  while the hash was full), never below 0. Read by enqueue for max_queued, by info, the
  exporter and the worker's beat (per-task trends). ]]
-- (one table, not locals: a script has at most 200 locals, and the library is near it)
local BL = {}

-- count delta jobs of task (nil: '') into (delta > 0) or out of (delta < 0) the backlog
function BL.count(task, delta)
  if delta == 0 then return end
  local key = BASE .. 'backlog'
  local f = 't:' .. (task or '')
  local n = call('HINCRBY', key, f, delta)
  if delta > 0 then
    if n == delta and call('HLEN', key) > BACKLOG_TASKS then
      call('HDEL', key, f)
      call('HINCRBY', key, '*', delta)
    end
    return
  end
  if n > 0 then return end
  call('HDEL', key, f)
  if n < 0 and call('HINCRBY', key, '*', n) <= 0 then call('HDEL', key, '*') end
end

-- count many at once: tasks in order of first sight, counts task -> delta
function BL.many(tasks, counts)
  for _, t in ipairs(tasks) do BL.count(t, counts[t]) end
end

-- note one job of task into tasks/counts (for backlog_many)
function BL.note(tasks, counts, task, delta)
  task = task or ''
  if not counts[task] then
    tasks[#tasks + 1] = task
    counts[task] = 0
  end
  counts[task] = counts[task] + delta
end

-- the longest waits (ms from due to start) of the jobs of tasks (in order) started now, waits:
-- task -> ms; kept per task until the next trend sample (base.."twait", a ZSET task -> the
-- longest, ZADD GT: one command per task; at most BACKLOG_TASKS tasks, the rest as '*'). A
-- task new there renews its TTL (2 minutes: a worker's beat samples it every 20 s; without
-- workers, it goes)
function BL.waited(tasks, waits)
  local key = BASE .. 'twait'
  for _, t in ipairs(tasks) do
    local w = waits[t]
    if w and call('ZADD', key, 'GT', w, t) == 1 then
      call('PEXPIRE', key, 120000)
      if call('ZCARD', key) > BACKLOG_TASKS then
        call('ZREM', key, t)
        call('ZADD', key, 'GT', w, '*')
      end
    end
  end
end

-- the queue's backlog: the sum of its counts (O(BACKLOG_TASKS)). A hash that cannot be one
-- (the wrong type, more fields than the bound, a sum above the keys the server holds: every
-- counted job has a record) is set aside and counting restarts from 0 (I9)
function BL.total()
  local key = BASE .. 'backlog'
  local n = call('HLEN', key)
  local total = 0
  if n <= BACKLOG_TASKS + 1 then
    local kv = call('HGETALL', key)  -- (HGETALL: the least-privilege ACL has no HVALS)
    for i = 2, #kv, 2 do
      local c = count_of(kv[i])
      if not c then total = -1 break end
      total = total + c
    end
  end
  -- (DBSIZE, which that ACL does not grant either, is skipped when refused)
  local keys = redis.pcall('DBSIZE')
  if n > BACKLOG_TASKS + 1 or total < 0 or (type(keys) == 'number' and total > keys) then
    set_aside(key, 'not a count of the backlog')
    return 0
  end
  return total
end
