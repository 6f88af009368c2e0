--[[ _lib: helpers prepended to every script (not a script of its own).
  Every transition script takes the same thirteen KEYS, in this order:
    KEYS[1] ready      KEYS[2] prio       KEYS[3] scheduled   KEYS[4] active
    KEYS[5] dead       KEYS[6] wake       KEYS[7] seq         KEYS[8] stats
    KEYS[9] qconf      KEYS[10] ring      KEYS[11] gactive    KEYS[12] gconf
    KEYS[13] gwait
  and ARGV[1] = the queue's key base ("<prefix>:{<queue>}:"), from which the keys of single jobs
  (base.."job:"..id), of groups' lanes (base.."g:"..group) and of rate windows are built; they
  share the queue's hash tag, so every key a script touches lives in one cluster slot.

  A job hash has: t task, p payload, s state, a attempts, m max attempts, l lease token (kept
  after the job leaves active, so that an ack resent after a lost reply is recognised),
  pr priority (absent = 0), g group (absent = none), o options (JSON, absent = none),
  ct created ms, due due ms, r result, e error, f finished ms, pg progress, w set while someone
  awaits the result (the finishing script then publishes the id on the channel base.."done").

  Lanes and fairness: runnable jobs without a group wait in the default lane (ready LIST for
  priority 0, prio ZSET otherwise); a group's runnable jobs wait in the ZSET base.."g:"..group.
  ring is a ZSET of the lanes that can be served now (member '' = the default lane), scored by
  turn: claim serves the lane with the lowest score, then moves it to the back. A group that
  cannot be served (paused, at its concurrency limit, out of rate) is parked: removed from the
  ring, and put back by whatever lifts the block (a job of it finishing, resume, a new limit,
  its rate window passing via gwait, a ZSET of group -> window end). So claim never looks at
  idle or blocked groups.
  qconf (queue settings): paused, rate_n, rate_ms, glimit (default group concurrency limit),
  grate_n, grate_ms (default group rate). gconf (per group): limit:<g>, rate_n:<g>, rate_ms:<g>,
  paused:<g>. gactive: group -> number of its jobs active now. ]]
local K_READY, K_PRIO, K_SCHED, K_ACTIVE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_DEAD, K_WAKE, K_SEQ, K_STATS = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_QCONF, K_RING, K_GACTIVE, K_GCONF, K_GWAIT = KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local BASE = ARGV[1]
-- parked workers (see "Parking" below): who, until when, and on what terms
local K_IDLE, K_IDLEW = BASE .. 'idle', BASE .. 'idlew'
-- priority p is stored with score (-p * 2^44 + seq): higher first, FIFO within a level
local PRIO_SPAN = 17592186044416
-- the most jobs one call moves at once (unpack() of their ids must stay within Lua's limits)
local MAX_BATCH = 1000

-- a number read from a record that anyone with write access could have garbled: nil, NaN and
-- infinities become the default
local function num(v, default)
  local n = tonumber(v)
  if not n or n ~= n or n == math.huge or n == -math.huge then return default end
  return n
end

-- a job's priority, as claim orders by it: a finite integer in -100..100
local function prio_of(v)
  return math.max(-100, math.min(100, math.floor(num(v, 0))))
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

-- the concurrency limit of a group (nil: none)
local function group_limit(g)
  return tonumber(redis.call('HGET', K_GCONF, 'limit:' .. g) or redis.call('HGET', K_QCONF, 'glimit'))
end

-- a lane that joins the ring takes the last turn: it waits at most one job per lane already
-- there, and a lane that empties and refills at once cannot jump ahead of waiting backlogs
local function join_ring(g)
  if not redis.call('ZSCORE', K_RING, g) then
    redis.call('ZADD', K_RING, redis.call('INCR', K_SEQ), g)
  end
end

-- put a lane in the ring if it has runnable jobs and nothing blocks it
local function activate(g)
  if g == '' then
    if redis.call('LLEN', K_READY) > 0 or redis.call('ZCARD', K_PRIO) > 0 then join_ring('') end
    return
  end
  if redis.call('ZCARD', lane_key(g)) == 0 then return end
  if redis.call('HEXISTS', K_GCONF, 'paused:' .. g) == 1 then return end
  if redis.call('ZSCORE', K_GWAIT, g) then return end
  local limit = group_limit(g)
  if limit and (tonumber(redis.call('HGET', K_GACTIVE, g)) or 0) >= limit then return end
  join_ring(g)
end

-- make a job runnable in its lane; front=true puts it ahead of its priority level
local function push_ready(id, pr, front, g)
  pr = prio_of(pr)
  local seq = 0
  if not g or g == '' then
    if pr == 0 then
      if front then redis.call('LPUSH', K_READY, id) else redis.call('RPUSH', K_READY, id) end
    else
      if not front then seq = redis.call('INCR', K_SEQ) % PRIO_SPAN end
      redis.call('ZADD', K_PRIO, -pr * PRIO_SPAN + seq, id)
    end
    join_ring('')
  else
    if not front then seq = redis.call('INCR', K_SEQ) % PRIO_SPAN end
    redis.call('ZADD', lane_key(g), -pr * PRIO_SPAN + seq, id)
    activate(g)
  end
end

-- a job of group g left the active state: free its slot, and the group may run again
local function release_slot(g)
  if g and g ~= '' then
    if redis.call('HINCRBY', K_GACTIVE, g, -1) <= 0 then redis.call('HDEL', K_GACTIVE, g) end
    activate(g)
  end
end

-- a job given back (retry, release): runnable after delay ms (0: now), by the server's clock
local function requeue(id, jk, delay, now, pr, g, front)
  if delay > 0 then
    redis.call('HSET', jk, 's', 'scheduled', 'due', now + delay)
    redis.call('ZADD', K_SCHED, now + delay, id)
  else
    redis.call('HSET', jk, 's', 'queued')
    push_ready(id, pr, front, g)
  end
end

-- leave one token in the wake list (never more), so that one blocked consumer wakes up
local function wake()
  if redis.call('LLEN', K_WAKE) == 0 then redis.call('RPUSH', K_WAKE, '1') end
end

-- announce a finished job or batch to whoever awaits it; pcall: a user without channel rights
-- (waiters then re-check on their own) must still be able to finish jobs
local function announce(key, name)
  if redis.call('HDEL', key, 'w') == 1 then redis.pcall('PUBLISH', BASE .. 'done', name) end
end

-- tell whoever awaits this job's result that it has finished (only if someone registered)
local function notify(id, jk)
  announce(jk, id)
end

--[[ Batches (fan-out / fan-in). A batch lives on its home queue (the queue of its callback):
  base.."batch:"..bid        HASH  s state (open|completed|failed|cancelled), total, done, failed,
                                   n (ids handed out), sealed, policy (continue|fail|ignore),
                                   cb (callback job id), grp / pri (sub-jobs' group and
                                   priority), lim (set: grp's limit is the batch's own), ttl, w
  base.."batch:"..bid..":all"  ZSET  sub-job members (the id for one on the home queue, else
                                     its own queue's key base followed by the id),
                                     scored by the order they were added
  base.."batch:"..bid..":seen" SET   members whose outcome was counted (exactly once)
  base.."batch:"..bid..":res"  HASH  member -> result      base..":err" HASH member -> error
  A sub-job's hash has b (batch id) and, when its batch lives on another queue, bh (that
  queue's name) and bm (its member name there); its outcome then goes through base.."outbox"
  (a LIST on its own queue) and is applied to the batch by batch.lua 'apply', so every script
  still touches one slot. ]]
local function batch_key(bid) return BASE .. 'batch:' .. bid end

-- count a sub-job into its batch (idempotent on the member); returns 1 if it was new
local function batch_add(bid, member)
  local bk = batch_key(bid)
  if redis.call('ZSCORE', bk .. ':all', member) then return 0 end
  redis.call('ZADD', bk .. ':all', redis.call('HINCRBY', bk, 'n', 1), member)
  redis.call('HINCRBY', bk, 'total', 1)
  return 1
end

local BATCH_KEYS = {':all', ':seen', ':res', ':err'}

-- a batch that ended keeps its record and collected results for its retention (ms; 0 forever)
local function expire_batch(bk, ttl)
  if ttl > 0 then
    redis.call('PEXPIRE', bk, ttl)
    for _, s in ipairs(BATCH_KEYS) do redis.call('PEXPIRE', bk .. s, ttl) end
  end
end

-- cancel a job that has not started (waiting, scheduled or queued): it leaves its lane at
-- once (LREM on the plain FIFO list is O(n) in its length); returns true if it was cancelled
local function cancel_waiting(id, jk, now, ttl)
  local r = redis.call('HMGET', jk, 's', 'g', 'pr')
  local s = r[1]
  if s ~= 'queued' and s ~= 'scheduled' and s ~= 'waiting' then return false end
  redis.call('HSET', jk, 's', 'cancelled', 'f', now)
  redis.call('ZREM', K_SCHED, id)
  if s == 'queued' then
    if r[2] then
      redis.call('ZREM', lane_key(r[2]), id)
    elseif (tonumber(r[3]) or 0) ~= 0 then
      redis.call('ZREM', K_PRIO, id)
    else
      redis.call('LREM', K_READY, 1, id)
    end
  end
  if ttl > 0 then redis.call('PEXPIRE', jk, ttl) end
  notify(id, jk)
  return true
end

-- fire the batch once every sub-job has an outcome and no more can be added
local function batch_maybe_finish(bid, now)
  local bk = batch_key(bid)
  local b = redis.call('HMGET', bk, 's', 'total', 'done', 'failed', 'sealed', 'policy', 'cb', 'grp', 'ttl', 'lim')
  if b[1] ~= 'open' or b[5] ~= '1' then return end
  local total, done, failed = tonumber(b[2]) or 0, tonumber(b[3]) or 0, tonumber(b[4]) or 0
  if done + failed < total then return end
  local state = 'completed'
  if failed > 0 and b[6] == 'fail' then state = 'failed' end
  redis.call('HSET', bk, 's', state, 'f', now)
  if b[7] then
    local ck = job_key(b[7])
    if redis.call('HGET', ck, 's') == 'waiting' then
      if state == 'completed' then
        redis.call('HSET', ck, 's', 'queued')
        push_ready(b[7], redis.call('HGET', ck, 'pr'), false, redis.call('HGET', ck, 'g'))
        wake()
      else
        cancel_waiting(b[7], ck, now, tonumber(b[9]) or 0)
      end
    end
  end
  if b[10] then redis.call('HDEL', K_GCONF, 'limit:' .. b[8]) end
  expire_batch(bk, tonumber(b[9]) or 0)
  announce(bk, 'batch:' .. bid)
end

-- record a sub-job's outcome in its batch (on this queue); exactly once per member
local function batch_apply(bid, member, ok, value, now)
  local bk = batch_key(bid)
  local state = redis.call('HGET', bk, 's')
  -- a batch that is gone or finished takes no more outcomes; a cancelled one still counts
  -- the sub-jobs that were running, and keeps its expiry
  if state ~= 'open' and state ~= 'cancelled' then return end
  if redis.call('SADD', bk .. ':seen', member) == 0 then return end
  if ok then
    redis.call('HINCRBY', bk, 'done', 1)
    redis.call('HSET', bk .. ':res', member, value)
  else
    redis.call('HINCRBY', bk, 'failed', 1)
    redis.call('HSET', bk .. ':err', member, value)
  end
  if state == 'cancelled' then
    expire_batch(bk, tonumber(redis.call('HGET', bk, 'ttl')) or 0)
  else
    batch_maybe_finish(bid, now)
  end
end

-- a job finished for good (completed, dead-lettered or cancelled): tell its batch, if any
-- returns true when the outcome was handed over through the outbox (see batch.lua 'apply')
local function batch_outcome(id, jk, ok, value, now)
  local r = redis.call('HMGET', jk, 'b', 'bh', 'bm')
  if not r[1] then return false end
  if not r[2] then
    batch_apply(r[1], id, ok, value, now)
    return false
  end
  -- the batch lives on another queue (another cluster slot): hand the outcome over, as
  -- length-prefixed fields (binary-safe: results may be pickles)
  local rec = {}
  for _, f in ipairs({r[1], r[2], r[3], ok and '1' or '0', value}) do
    rec[#rec + 1] = #f .. ':' .. f
  end
  redis.call('RPUSH', BASE .. 'outbox', table.concat(rec))
  return true
end

-- move a job to the dead-letter store with its reason
local function to_dead(id, jk, now, err, dead_ttl)
  redis.call('HSET', jk, 's', 'failed', 'e', err, 'f', now)
  redis.call('ZADD', K_DEAD, now, id)
  if dead_ttl > 0 then redis.call('PEXPIRE', jk, dead_ttl) end
  notify(id, jk)
  batch_outcome(id, jk, false, err, now)
end

local STATES = {waiting = true, scheduled = true, queued = true, active = true,
  completed = true, failed = true, cancelled = true}

-- a record whose state was garbled is kept as a dead letter with the reason, never dropped
local function dead_if_corrupt(id, jk, state, now, dead_ttl)
  if state and not STATES[state] then
    to_dead(id, jk, now, cjson.encode({type = 'CorruptState',
      message = 'the job record had an unknown state: ' .. tostring(state)}), dead_ttl)
    return true
  end
  return false
end

-- hand back jobs whose lease ran out (their worker died or hung): requeue, or dead-letter
-- those that have used up their attempts; returns how many were recovered
local function recover(now, limit, dead_ttl)
  limit = math.min(limit, MAX_BATCH)
  local ids = redis.call('ZRANGEBYSCORE', K_ACTIVE, '-inf', now, 'LIMIT', 0, limit)
  if #ids == 0 then return 0 end
  local dead, cancelled = 0, 0
  redis.call('ZREM', K_ACTIVE, unpack(ids))
  for _, id in ipairs(ids) do
    local jk = job_key(id)
    local r = redis.call('HMGET', jk, 's', 'a', 'm', 'pr', 'g', 'x')
    if dead_if_corrupt(id, jk, r[1], now, dead_ttl) then
      dead = dead + 1
    elseif r[1] == 'active' then
      local a, m = num(r[2], 0), num(r[3], 1)
      if r[6] then
        -- cancelled while its holder was lost: it stays cancelled, it is not run again
        local err = cjson.encode({type = 'Cancelled', message = 'cancelled while running'})
        redis.call('HSET', jk, 's', 'cancelled', 'e', err, 'f', now)
        if dead_ttl > 0 then redis.call('PEXPIRE', jk, dead_ttl) end
        notify(id, jk)
        batch_outcome(id, jk, false, err, now)
        cancelled = cancelled + 1
      elseif a >= m then
        redis.call('HDEL', jk, 'l')
        to_dead(id, jk, now, cjson.encode({type = 'LeaseExpired',
          message = 'lease expired on attempt ' .. a .. ' of ' .. m .. ' (worker lost)'}), dead_ttl)
        dead = dead + 1
      else
        -- the expired holder's token no longer counts, not even as a resent ack
        redis.call('HSET', jk, 's', 'queued')
        redis.call('HDEL', jk, 'l')
        push_ready(id, r[4], true, r[5])
      end
      release_slot(r[5])
    end
  end
  redis.call('HINCRBY', K_STATS, 'expired', #ids)
  if dead > 0 then redis.call('HINCRBY', K_STATS, 'failed', dead) end
  if cancelled > 0 then redis.call('HINCRBY', K_STATS, 'cancelled', cancelled) end
  if #ids > dead + cancelled then wake() end
  return #ids
end

-- make delayed jobs that are due runnable, and groups whose rate window passed servable again
local function promote(now, limit)
  limit = math.min(limit, MAX_BATCH)
  local groups = redis.call('ZRANGEBYSCORE', K_GWAIT, '-inf', now, 'LIMIT', 0, limit)
  if #groups > 0 then
    redis.call('ZREM', K_GWAIT, unpack(groups))
    for _, g in ipairs(groups) do activate(g) end
  end
  local ids = redis.call('ZRANGEBYSCORE', K_SCHED, '-inf', now, 'LIMIT', 0, limit)
  if #ids == 0 then return #groups end
  for _, id in ipairs(ids) do
    local jk = job_key(id)
    local r = redis.call('HMGET', jk, 's', 'pr', 'g')
    if r[1] == 'scheduled' then
      redis.call('HSET', jk, 's', 'queued')
      push_ready(id, r[2], false, r[3])
    end
  end
  redis.call('ZREM', K_SCHED, unpack(ids))
  return #ids + #groups
end

-- the earliest instant at which a consumer that found nothing should look again: the next
-- due delayed job, lease to run out, or rate window to open; -1 when there is none
local function next_wake()
  local best = -1
  for _, k in ipairs({K_SCHED, K_ACTIVE, K_GWAIT}) do
    local s = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
    if s[2] and (best < 0 or tonumber(s[2]) < best) then best = tonumber(s[2]) end
  end
  return best
end

local function has_ready()
  return redis.call('ZCARD', K_RING) > 0
end


-- finish active jobs with their results, fenced by lease tokens: n groups of 4 values (id,
-- token, result, result_ttl_ms) from ARGV[first]; returns one code per job (see complete.lua)
local function do_complete(first, n, now)
  local out = {}
  local ok = 0
  local done = {}
  for i = 0, n - 1 do
    local b = first + i * 4
    local id, tok, ttl = ARGV[b], ARGV[b + 1], tonumber(ARGV[b + 3])
    local jk = job_key(id)
    local r = redis.call('HMGET', jk, 's', 'l', 'g', 'w', 'b')
    if not r[1] then
      out[#out + 1] = -1
    elseif r[1] == 'completed' and r[2] == tok then
      out[#out + 1] = 1
    elseif r[1] ~= 'active' or r[2] ~= tok then
      out[#out + 1] = -2
    else
      done[#done + 1] = id
      release_slot(r[3])
      redis.call('HSET', jk, 's', 'completed', 'r', ARGV[b + 2], 'f', now)
      if r[4] then notify(id, jk) end
      local code = 1
      if r[5] and batch_outcome(id, jk, true, ARGV[b + 2], now) then code = 2 end
      if ttl == 0 then
        redis.call('DEL', jk)
      elseif ttl > 0 then
        redis.call('PEXPIRE', jk, ttl)
      end
      ok = ok + 1
      out[#out + 1] = code
    end
  end
  if ok > 0 then
    redis.call('ZREM', K_ACTIVE, unpack(done))
    redis.call('HINCRBY', K_STATS, 'completed', ok)
    -- a freed group slot may have made a parked group runnable
    if has_ready() then wake() end
  end
  return out
end

-- lease up to want runnable jobs (see claim.lua for the order and the reply). handing: a claim
-- made by enqueue for a parked worker, which skips the maintenance (the worker's own claims and
-- reap do it) and the next wake-up time (nobody reads it)
local function do_claim(want, lease, dead_ttl, now, handing)
  -- Lua's unpack() takes a few thousand values at most: callers ask for at most MAX_BATCH
  want = math.min(want, MAX_BATCH)
  local asked = want
  if not handing then
    recover(now, 100, dead_ttl)
    promote(now, math.max(want, 100))
  end

  local q = redis.call('HMGET', K_QCONF, 'paused', 'rate_n', 'rate_ms', 'glimit', 'grate_n', 'grate_ms')
  local rate_wake = -1
  local qrate_key = nil
  if q[1] then want = 0 end
  local qrn, qrms = num(q[2], nil), num(q[3], nil)
  if want > 0 and qrn and qrms and qrms > 0 then
    local rn, rms = qrn, qrms
    local window = math.floor(now / rms)
    qrate_key = BASE .. 'qrate:' .. window
    local left = rn - (tonumber(redis.call('GET', qrate_key)) or 0)
    if left <= 0 then
      want = 0
      rate_wake = (window + 1) * rms
    elseif left < want then
      want = left
    end
  end
  local glimit_default, grate_n_default, grate_ms_default = num(q[4], nil), num(q[5], nil), num(q[6], nil)

  -- the default lane's next jobs, and true when it is known to be empty after them
  local function pop_default(room)
    local ids = {}
    -- priority above 0 (negative scores), then the plain FIFO lane, then priority below 0
    local prio = redis.call('EXISTS', K_PRIO) == 1
    if prio then
      local hi = redis.call('ZRANGEBYSCORE', K_PRIO, '-inf', '(0', 'LIMIT', 0, room)
      if #hi > 0 then
        redis.call('ZREM', K_PRIO, unpack(hi))
        for _, id in ipairs(hi) do ids[#ids + 1] = id end
      end
    end
    if #ids < room then
      local plain = redis.call('LPOP', K_READY, room - #ids)
      if plain then for _, id in ipairs(plain) do ids[#ids + 1] = id end end
      -- the plain lane ran dry, and there was no priority lane: empty
      if #ids < room and not prio then return ids, true end
    end
    if prio and #ids < room then
      local lo = redis.call('ZPOPMIN', K_PRIO, room - #ids)
      for i = 1, #lo, 2 do ids[#ids + 1] = lo[i] end
    end
    return ids, false
  end

  local out = {now, -1}
  local zargs = {}
  local taken_total = 0
  local guard = 2 * want + 100
  -- bounded: a turn that keeps its lane in the ring takes (or drops) jobs and counts against
  -- guard; a turn that parks or empties a lane removes it from the ring
  while taken_total < want and guard > 0 do
    local head = redis.call('ZRANGE', K_RING, 0, 0)
    if #head == 0 then break end
    local g = head[1]
    local room = want - taken_total
    if room > 1 and redis.call('ZCARD', K_RING) > 1 then room = 1 end
    local blocked, wait_until = false, nil
    local limit, active, rate_key, rate_n, rate_ms, rate_used = nil, 0, nil, nil, nil, 0
    if g ~= '' then
      -- every setting of the group in one read
      local gc = redis.call('HMGET', K_GCONF, 'paused:' .. g, 'limit:' .. g, 'rate_n:' .. g,
        'rate_ms:' .. g)
      if gc[1] then
        blocked = true
      else
        limit = num(gc[2], glimit_default)
        if limit then
          active = num(redis.call('HGET', K_GACTIVE, g), 0)
          if active >= limit then blocked = true elseif limit - active < room then room = limit - active end
        end
        rate_n = num(gc[3], grate_n_default)
        rate_ms = num(gc[4], grate_ms_default)
        if not (rate_ms and rate_ms > 0) then rate_n = nil end  -- a garbled rate is no rate
        if rate_n and not blocked then
          local window = math.floor(now / rate_ms)
          rate_key = BASE .. 'grate:' .. g .. ':' .. window
          rate_used = tonumber(redis.call('GET', rate_key)) or 0
          if rate_used >= rate_n then
            blocked, wait_until = true, (window + 1) * rate_ms
          elseif rate_n - rate_used < room then
            room = rate_n - rate_used
          end
        end
      end
    end
    local got = {}
    local drained = false
    if not blocked then
      if g == '' then
        got, drained = pop_default(room)
      else
        local z = redis.call('ZPOPMIN', lane_key(g), room)
        for i = 1, #z, 2 do got[#got + 1] = z[i] end
      end
    end
    local taken = 0
    local tok = 0
    if #got > 0 then tok = redis.call('INCRBY', K_SEQ, #got) - #got end
    for _, id in ipairs(got) do
      local jk = job_key(id)
      local r = redis.call('HMGET', jk, 's', 'a', 't', 'p', 'o', 'm')
      -- anything not queued (cancelled, or its record expired) is dropped from the lane here;
      -- a garbled state is dead-lettered
      if dead_if_corrupt(id, jk, r[1], now, dead_ttl) then
        redis.call('HINCRBY', K_STATS, 'failed', 1)
      elseif r[1] == 'queued' then
        tok = tok + 1
        taken = taken + 1
        local a = math.floor(num(r[2], 0)) + 1
        redis.call('HSET', jk, 's', 'active', 'a', a, 'l', tok)
        zargs[#zargs + 1] = now + lease
        zargs[#zargs + 1] = id
        local n = #out
        out[n + 1] = id
        out[n + 2] = tok
        out[n + 3] = a
        out[n + 4] = r[3] or ''
        out[n + 5] = r[4] or ''
        out[n + 6] = r[5] or ''
        out[n + 7] = math.max(1, math.floor(num(r[6], 1)))
      end
    end
    taken_total = taken_total + taken
    if g ~= '' and taken > 0 then
      active = redis.call('HINCRBY', K_GACTIVE, g, taken)
      if rate_key then
        rate_used = redis.call('INCRBY', rate_key, taken)
        redis.call('PEXPIRE', rate_key, 2 * rate_ms)
      end
    end
    -- the lane's next turn: back of the ring, or parked until what blocks it is lifted
    local empty
    if g == '' then
      empty = drained or (redis.call('LLEN', K_READY) == 0 and redis.call('ZCARD', K_PRIO) == 0)
    else
      empty = redis.call('EXISTS', lane_key(g)) == 0
      if not blocked and limit and active >= limit then blocked = true end
      if not blocked and rate_key and rate_used >= rate_n then
        blocked, wait_until = true, (math.floor(now / rate_ms) + 1) * rate_ms
      end
    end
    if empty or blocked then
      redis.call('ZREM', K_RING, g)
      if wait_until and not empty then redis.call('ZADD', K_GWAIT, wait_until, g) end
    else
      redis.call('ZADD', K_RING, redis.call('INCR', K_SEQ), g)
      guard = guard - 1
    end
  end

  if #zargs > 0 then
    -- a lease that runs out before every other one: an idle consumer must re-arm its wake-up
    -- for it (it blocked knowing only the earlier deadlines), so leave it a token
    local first = redis.call('ZRANGE', K_ACTIVE, 0, 0, 'WITHSCORES')
    redis.call('ZADD', K_ACTIVE, unpack(zargs))
    if not first[2] or now + lease < tonumber(first[2]) then wake() end
  end
  if qrate_key and taken_total > 0 then
    redis.call('INCRBY', qrate_key, taken_total)
    redis.call('PEXPIRE', qrate_key, 2 * tonumber(q[3]))
  end
  -- runnable jobs left for other consumers; not while paused or out of rate, or every
  -- consumer's blocking wait would return at once and spin
  if not q[1] and rate_wake < 0 and has_ready() then wake() end
  if taken_total < asked and not handing then
    local nw = next_wake()
    if rate_wake >= 0 and (nw < 0 or rate_wake < nw) then nw = rate_wake end
    out[2] = nw
  end
  return out
end

-- Parking (an idle worker's fast path): a worker whose claim found too little registers in
-- base.."idle" (ZSET wid -> end of the registration) with what it can take in base.."idlew";
-- it then blocks on its hand list and the wake list at once. enqueue claims new jobs for
-- parked workers on their behalf (do_claim: every QoS rule applies) and pushes the leases,
-- 7 values per job as in claim's reply, onto base.."hand:"..wid, so a job reaches an idle
-- worker in one hop. A worker that dies parked holds what it was handed only until the
-- leases run out (recover brings the jobs back) and its registration ends by itself.

local function hand_key(wid) return BASE .. 'hand:' .. wid end

-- (re)register a worker as parked until the server time `ends` (nil: its registration keeps
-- the end it has), able to take want more jobs on these terms
local function park(wid, ends, want, lease, dead_ttl)
  if ends then redis.call('ZADD', K_IDLE, ends, wid) end
  redis.call('HSET', K_IDLEW, wid, want .. ' ' .. lease .. ' ' .. dead_ttl)
end

-- drop the registrations of these workers
local function unregister(...)
  redis.call('ZREM', K_IDLE, ...)
  redis.call('HDEL', K_IDLEW, ...)
end

-- a worker's claim: take back its own registration and the jobs handed to it meanwhile
-- (appended to out); returns how many jobs that was
local function unpark(wid, out)
  unregister(wid)
  local hk = hand_key(wid)
  local held = redis.call('LRANGE', hk, 0, -1)
  if #held == 0 then return 0 end
  redis.call('DEL', hk)
  for _, v in ipairs(held) do out[#out + 1] = v end
  return #held / 7
end

-- runnable jobs have just been added: lease them to parked workers, the one whose parking ends
-- last first (a worker with room left stays parked; has_ready() ends the loop when none remain).
-- Registrations that ran out (a worker that died parked) are dropped once they reach the head,
-- i.e. once every registration left has run out; reap drops them all the while.
local function hand_off(now)
  while true do
    -- the busy case (nobody parked) costs one command
    local head = redis.call('ZRANGE', K_IDLE, -1, -1, 'WITHSCORES')
    if #head == 0 then return end
    local wid = head[1]
    if tonumber(head[2]) <= now then
      redis.call('DEL', K_IDLE, K_IDLEW)
      return
    end
    local reg = redis.call('HGET', K_IDLEW, wid) or ''
    local want, lease, dead_ttl = string.match(reg, '^(%d+) (%d+) (%d+)$')
    local taken = 0
    if want then
      want = tonumber(want)
      local out = do_claim(want, tonumber(lease), tonumber(dead_ttl), now, true)
      taken = (#out - 2) / 7
      if taken > 0 then
        local hk = hand_key(wid)
        redis.call('RPUSH', hk, unpack(out, 3))
        redis.call('PEXPIRE', hk, tonumber(lease))
      end
      -- nothing it may take now (a pause, a limit): neither may the others
      if taken == 0 then return end
    end
    if want and taken < want then
      -- room left: it stays parked for the rest
      park(wid, nil, want - taken, lease, dead_ttl)
    else
      unregister(wid)
    end
    if not has_ready() then return end
  end
end

-- registrations that ran out (workers that died parked), for reap
local function drop_stale_parking(now)
  local stale = redis.call('ZRANGEBYSCORE', K_IDLE, '-inf', now, 'LIMIT', 0, MAX_BATCH)
  if #stale > 0 then unregister(unpack(stale)) end
end

-- claim for a worker (wid '' = a pull-API consumer, which never parks)
local function claim_for(wid, want, lease, dead_ttl, park_ms, now)
  local handed = {}
  local n = 0
  if wid ~= '' then n = unpark(wid, handed) end
  local out = do_claim(math.max(want - n, 0), lease, dead_ttl, now)
  local taken = (#out - 2) / 7
  for _, v in ipairs(handed) do out[#out + 1] = v end
  if wid ~= '' and park_ms > 0 and n + taken < want then
    park(wid, now + park_ms, want - n - taken, lease, dead_ttl)
  end
  return out
end
