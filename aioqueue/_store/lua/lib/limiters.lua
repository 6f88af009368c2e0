--[[ limiters: named limiters (docs/flow-control.md), applied where a job is leased
  (limits_check, limits_charge) and where it stops being active (limits_done); jobs a limit
  does not admit wait aside, out of their lane, until it may (release_held).
  Needs: core, lanes (push_ready).

  A job that needs limits carries them in its options (o, JSON), field "lim":
  {"b": limiter base, "l": [[name, key, rate_n, period_ms, burst, concurrency], ...]}, at most
  MAX_JOB_LIMITS, names and keys at most 200 bytes. The limiter base is BASE (per queue: what
  a Cluster needs) or LIM_SHARED, the prefix's "<prefix>:" (shared by every queue of the
  prefix); anything else is garbage (the job is dead-lettered: a planted job cannot touch
  keys outside its prefix). Under the base b:
    b.."lim:"..name            HASH the limit's run-time settings (n, ms, burst, conc; set by
                                    set_limit, they win over the job's)
    b.."lim:{"..name..":"..key.."}" HASH a key's state (its own hash tag, after the queue's
                                    on a Cluster): tat (GCRA's theoretical arrival time, server
                                    ms), T and tau (its emission interval and tolerance, ms),
                                    c (concurrency); expires once tat passed
    that..":log"               LIST its last n starts (server ms), oldest first (see below)
    that..":h"                 HASH job key -> lease token: the jobs holding its concurrency
                                    slots (a holder no longer active with that token is stale)
  and in the queue: BASE.."lwait" ZSET state key -> when to look again (its next admission by
  rate, or a concurrency re-check), BASE.."lw:"..state key LIST this queue's jobs waiting on
  it (state queued, out of their lane).

  GCRA: a limit of n per ms milliseconds admits one job every T = ms/n; a job is admitted at
  now when tat - now <= tau = (burst - 1) * T, and moves tat to max(tat, now - T/2) + T: a
  start that came late (no claim ran at its turn) keeps up to half a turn of its lateness, so
  the rate is kept up while starts stay at least T/2 apart. The window is exact besides: a
  rate of n <= MAX_LOG per ms also keeps its last n starts (that..":log", LIST)
  and admits no start while the n-th last one is less than ms ago, so no window of ms
  milliseconds ever holds more than n starts, at its edges included. A job is admitted only
  when every limit it needs admits it, and charged (tat moved, slot taken) only then. ]]

-- the limiters' constants, in one table (a script's main function may have 200 locals):
-- MAX_JOB_LIMITS limits a job may need; a rate of at most MAX_LOG starts per period also keeps
-- its last n starts (see above); a job waiting on a concurrency slot held in another queue is
-- looked at again every CONC_RECHECK_MS; RELEASE_MAX waiting jobs at most go back to their
-- lanes per limit key and turn; MAX_HOLDERS holders at most per concurrency limit; AIMD (see
-- limits_backoff)
local LIM = {MAX_JOB_LIMITS = 8, MAX_LOG = 1000, CONC_RECHECK_MS = 1000, RELEASE_MAX = 100,
  MAX_HOLDERS = 1000, AIMD_MIN = 1 / 64, AIMD_STEP = 0.1, DECREASE_GAP_MS = 100,
  MAX_PAUSE_MS = 3600000}
local LIM_SHARED = string.sub(BASE, 1, (string.find(BASE, '{', 1, true) or 1) - 1)
local K_LWAIT = BASE .. 'lwait'

-- a limit's setting (a count of starts, ms, a burst, a concurrency): a whole number in
-- 1..(max or 1e12), else nil (garbage, or none)
function LIM.lim_count(v, max)
  local n = tonumber(v)
  if not n or n ~= n or n <= 0 or n ~= math.floor(n) or n > (max or 1e12) then return nil end
  return n
end

-- keys under LIM_SHARED may be used here: always on one server; on a Cluster only when they
-- share this queue's slot (the server refuses the others, an error pcall catches), which the
-- Python side never asks for (it uses BASE there): planted limits are garbage, not an error
function LIM.local_keys(...)
  return type(redis.pcall('EXISTS', K_LWAIT, ...)) == 'number'
end

-- the limits of a job from its options o: nil none, false garbage, else a list of
-- {st (state key), T, tau, c (concurrency or nil)}; cfg caches the run-time settings read
function LIM.job_limits(o, cfg)
  if not o or not string.find(o, '"lim"', 1, true) then return nil end
  local ok, v = pcall(cjson.decode, o)
  if not ok or type(v) ~= 'table' or type(v.lim) ~= 'table' then return false end
  local b, l = v.lim.b, v.lim.l
  if (b ~= BASE and b ~= LIM_SHARED) or type(l) ~= 'table' or #l > LIM.MAX_JOB_LIMITS then
    return false
  end
  local out = {}
  for i, e in ipairs(l) do
    if type(e) ~= 'table' or type(e[1]) ~= 'string' or type(e[2]) ~= 'string'
      or #e[1] > 200 or #e[2] > 200 then return false end
    local ck = b .. 'lim:' .. e[1]
    if b ~= BASE and not LIM.local_keys(ck) then return false end
    local s = cfg and cfg[ck]
    if not s then
      s = call('HMGET', ck, 'n', 'ms', 'burst', 'conc')
      if cfg then cfg[ck] = s end
    end
    -- each setting: the run-time one, else the job's (as declared), unless garbage
    local n = LIM.lim_count(s[1]) or LIM.lim_count(e[3])
    local ms = LIM.lim_count(s[2]) or LIM.lim_count(e[4])
    local burst = LIM.lim_count(s[3]) or LIM.lim_count(e[5]) or 1
    local T = nil
    if n and ms then T = ms / n end
    local c = LIM.lim_count(s[4], LIM.MAX_HOLDERS) or LIM.lim_count(e[6], LIM.MAX_HOLDERS)
    local st = b .. 'lim:{' .. e[1] .. ':' .. e[2] .. '}'
    if b ~= BASE and not LIM.local_keys(st, ck) then return false end
    out[i] = {st = st, T = T, tau = T and (burst - 1) * T or 0, c = c, name = e[1], key = e[2]}
    if T and n <= LIM.MAX_LOG then out[i].n, out[i].ms = math.floor(n), ms end
    if T then out[i].n0 = n end
  end
  return out
end

-- the holders of a concurrency limit that are still active with their token (the stale
-- ones found are dropped); returns how many hold it. A holders hash over MAX_HOLDERS entries
-- is garbage (a limit's concurrency is at most that): it is dropped, counted again from
-- the leases made after
function LIM.live_holders(hk, now)
  local n = call('HLEN', hk)
  if n > LIM.MAX_HOLDERS then
    call('DEL', hk)
    return 0
  end
  local all = call('HGETALL', hk)
  local stale = {}
  for i = 1, #all, 2 do
    local f, v = all[i], all[i + 1]
    if string.sub(f, 1, 5) == 'code:' then
      -- held by code (limit.lua) until a deadline
      if num(v, 0) < now then stale[#stale + 1] = f end
    else
      local r = redis.pcall('HMGET', f, 's', 'l')
      if type(r) ~= 'table' or r[1] ~= 'active' or r[2] ~= v then stale[#stale + 1] = f end
    end
  end
  if #stale > 0 then call('HDEL', hk, unpack(stale)) end
  return n - #stale
end

-- adaptive backoff (AIMD): a job that raised RateLimited halves its rate limits' factor f
-- (at most once per DECREASE_GAP_MS, down to AIMD_MIN) and pauses them until its retry_after;
-- each success adds AIMD_STEP / (f * n) to it (n: the declared starts per period), so the
-- rate climbs back by AIMD_STEP of the declared rate per period, up to it (f 1, not stored)

-- a factor as stored: within AIMD_MIN..1, anything else (garbage, absent) 1
function LIM.aimd_factor(v)
  local f = num(v, 1)
  if f > 1 or f < LIM.AIMD_MIN then return 1 end
  return f
end

-- job (options o) raised RateLimited: back off its rate limits for every worker, and start
-- none of their jobs for pause ms
function LIM.limits_backoff(o, now, pause)
  local lims = LIM.job_limits(o, nil)
  if not lims then return end
  pause = math.min(math.max(pause, 0), LIM.MAX_PAUSE_MS)
  for _, l in ipairs(lims) do
    if l.T then
      local s = call('HMGET', l.st, 'tat', 'f', 'fd')
      local f = LIM.aimd_factor(s[2])
      if now - num(s[3], 0) >= LIM.DECREASE_GAP_MS or num(s[3], 0) > now then
        f = math.max(f / 2, LIM.AIMD_MIN)
      end
      local tat = math.max(num(s[1], now), now + pause)
      if tat > now + pause + l.tau / f + l.T / f + 1 then tat = now + pause end
      call('HSET', l.st, 'f', f, 'fd', now, 'tat', string.format('%.3f', tat), 'T', l.T / f,
        'tau', l.tau / f, 'c', l.c or 0)
      call('PEXPIRE', l.st, math.ceil(tat - now) + 60000)
    end
  end
end

-- a job needing these limits succeeded: their factors climb back (see above)
function LIM.limits_climb(lims)
  for _, l in ipairs(lims) do
    if l.T and l.n0 then
      local f = call('HGET', l.st, 'f')
      if f then
        f = LIM.aimd_factor(f)
        f = f + LIM.AIMD_STEP / (f * l.n0)
        if f >= 1 then call('HDEL', l.st, 'f') else call('HSET', l.st, 'f', f) end
      end
    end
  end
end

-- until when limit l (of job_limits) admits nothing (server ms), and whether by its rate
-- ('rate') or its concurrency ('conc'); nil when it admits a job now (its tat is then in l.tat)
function LIM.closed_until(l, now, read_only)
  if l.T then
    local s = call('HMGET', l.st, 'tat', 'f', 'T')
    -- adaptive backoff: the rate is the declared one times f (see limits_backoff)
    local f = LIM.aimd_factor(s[2])
    if f < 1 then
      l.T, l.tau, l.f = l.T / f, l.tau / f, f
    end
    local tat = num(s[1], now)
    -- the rate changed since the last start (set_limit, a new declaration): the debt ahead
    -- of now is kept in starts, not in ms (a raised rate admits at once what it would), and
    -- stored at the new rate (once: a debt rescaled on every look would never run out)
    local T0 = tonumber(s[3])
    if tat > now and T0 and T0 == T0 and T0 > 0 and T0 < 1e12 and T0 ~= l.T then
      tat = now + (tat - now) * l.T / T0
      if not read_only then
        call('HSET', l.st, 'tat', string.format('%.3f', tat), 'T', l.T, 'tau', l.tau)
      end
    end
    -- nothing moves tat further than a pause of MAX_PAUSE_MS ahead: beyond that it is garbage
    if tat > now + l.tau + l.T + LIM.MAX_PAUSE_MS then tat = now end
    if tat - now > l.tau then return tat - l.tau, 'rate' end
    -- a start later than its turn keeps up to half a turn of its lateness (see above)
    l.tat = math.max(tat, now - l.T / 2)
    if l.n then
      -- the window's exact bound: the n-th last start is a whole period ago
      local nth = num(call('LRANGE', l.st .. ':log', -l.n, -l.n)[1], nil)
      -- (a start in the future is garbage)
      if nth and nth > now - l.ms and nth <= now then return nth + l.ms, 'rate' end
    end
  end
  local full = l.c and call('HLEN', l.st .. ':h') >= l.c
  if full and (read_only or LIM.live_holders(l.st .. ':h', now) >= l.c) then
    return now + LIM.CONC_RECHECK_MS, 'conc'
  end
  return nil
end

-- may job id (options o) start now? nil: it needs no limit; false: it does not start (it
-- waits aside); 'garbled': its limits cannot be read (the caller dead-letters it); else its limits, for
-- limits_charge once it is leased. memo (per claim): run-time settings read, and the state
-- keys already found closed in this claim (their later jobs wait at once)
function LIM.limits_check(id, o, now, memo)
  local lims = LIM.job_limits(o, memo.cfg)
  if lims == nil then return nil end
  if lims == false then return 'garbled' end
  for _, l in ipairs(lims) do
    if memo.closed[l.st] then
      call('RPUSH', BASE .. 'lw:' .. l.st, id)
      return false
    end
  end
  for _, l in ipairs(lims) do
    local at = LIM.closed_until(l, now)
    if at then
      memo.closed[l.st] = true
      if not memo.flagged then
        -- jobs wait aside in this queue: its claims look at lwait (see release_held)
        call('HSET', K_QCONF, 'lw', 1)
        memo.flagged = true
      end
      -- it waits on state key st until at (server ms)
      call('RPUSH', BASE .. 'lw:' .. l.st, id)
      call('ZADD', K_LWAIT, 'LT', math.ceil(at), l.st)
      return false
    end
  end
  return lims
end

-- charge job jk (leased with token tok) to the limits limits_check admitted it by (or code
-- holding them: jk 'code:<id>', tok its deadline)
function LIM.limits_charge(lims, jk, tok, now)
  for _, l in ipairs(lims) do
    local f = {'c', l.c or 0}
    local next_at = nil
    if l.T then
      l.tat = l.tat + l.T
      next_at = l.tat - l.tau
      f = {'tat', string.format('%.3f', l.tat), 'T', l.T, 'tau', l.tau, 'c', l.c or 0}
      if l.n then
        local log = l.st .. ':log'
        local len = call('RPUSH', log, now)
        if len > l.n then call('LPOP', log, len - l.n) end
        call('PEXPIRE', log, math.ceil(l.ms))
        if len >= l.n then
          next_at = math.max(next_at, num(call('LRANGE', log, 0, 0)[1], 0) + l.ms)
        end
      end
    end
    call('HSET', l.st, unpack(f))
    -- this queue's jobs waiting on it are looked at again when its rate admits the next
    if next_at and call('EXISTS', BASE .. 'lw:' .. l.st) == 1 then
      call('ZADD', K_LWAIT, math.ceil(next_at), l.st)
    end
    call('PEXPIRE', l.st, math.ceil(math.max((l.tat or now) - now, 0)) + 60000)
    if l.c then call('HSET', l.st .. ':h', jk, tok) end
  end
end

-- put up to k jobs waiting on state key st back at the front of their lanes, in their order
function LIM.wake_held(st, k)
  local ids = call('LPOP', BASE .. 'lw:' .. st, k)
  if not ids then return 0 end
  for i = #ids, 1, -1 do
    local r = call('HMGET', job_key(ids[i]), 's', 'pr', 'g')
    if r[1] == 'queued' then push_ready(ids[i], r[2], true, r[3]) end
  end
  return #ids
end

-- job jk (options o; or code 'code:<id>', see limit.lua) is no longer active: free its
-- concurrency slots, and a job of this queue waiting on one may go; ok: it succeeded (its
-- rate limits climb back, see limits_backoff)
function LIM.limits_done(o, jk, ok)
  local lims = LIM.job_limits(o, nil)
  if not lims then return end
  if ok then LIM.limits_climb(lims) end
  for _, l in ipairs(lims) do
    if l.c and call('HDEL', l.st .. ':h', jk) == 1 then LIM.wake_held(l.st, 1) end
  end
end

-- put back in their lanes as many of the jobs waiting on state key st as its rate would
-- admit now (or its free slots); the rest are looked at again when the next of them may go.
-- Returns how many went back
function LIM.release_one(st, now)
  local s = call('HMGET', st, 'tat', 'T', 'tau', 'c')
  local T, tau = tonumber(s[2]), num(s[3], 0)
  if not T or T ~= T or T <= 0 or T > 1e12 then T = nil end
  local k = 1
  if T then
    k = math.floor((now + tau - math.max(num(s[1], now), now)) / T) + 1
  elseif LIM.lim_count(s[4]) then
    k = LIM.lim_count(s[4]) - call('HLEN', st .. ':h')
  end
  k = math.max(1, math.min(LIM.RELEASE_MAX, k))
  local moved = LIM.wake_held(st, k)
  if call('EXISTS', BASE .. 'lw:' .. st) == 1 then
    call('ZADD', K_LWAIT, now + math.max(1, math.ceil(k * (T or LIM.CONC_RECHECK_MS))), st)
  else
    call('ZREM', K_LWAIT, st)
  end
  return moved
end

-- waiting jobs whose limits may admit them now go back to their lanes (release_one for
-- each limit key due, at most 100 a call). A claim calls it only while qconf's lw is set
-- (jobs wait aside: set when one starts waiting, dropped here once none does), so plain
-- queues pay nothing for it; reap calls it in any case. Returns how many went back
function LIM.release_held(now)
  local due = call('ZRANGEBYSCORE', K_LWAIT, '-inf', now, 'LIMIT', 0, 100)
  local moved = 0
  for _, st in ipairs(due) do
    -- (a member that names a limit key this queue may use)
    if string.sub(st, 1, #BASE + 5) == BASE .. 'lim:{' or (string.sub(st, 1, #LIM_SHARED + 5)
      == LIM_SHARED .. 'lim:{' and LIM.local_keys(st)) then
      moved = moved + LIM.release_one(st, now)
    else
      -- planted: not a limit key (its list of waiting ids is dropped: they are no jobs)
      call('ZREM', K_LWAIT, st)
      call('DEL', BASE .. 'lw:' .. st)
    end
  end
  if call('ZCARD', K_LWAIT) == 0 then call('HDEL', K_QCONF, 'lw') end
  return moved
end
