--[[ acks: a worker's (or a pull-API consumer's) answers for the jobs it leased: finish them
  with their results (do_complete, fenced by lease tokens), or give them back to run again
  later (requeue: a retry, a release).
  Needs: core, trends (trend), events (emit_add, emit_flush), lanes (push_ready, release_slots,
  has_ready), limiters (limits_done), batches (batch_outcome; deps_outcome, declared there
  and set by the part on dependencies), deps (DQ.telling and DQ.told: the dependents of the
  jobs one call completes are told together).

  Throughput (tally): the HASH base.."tp" counts jobs per minute of the server clock, field
  '<kind>:<minute>' (kind c completed, f dead-lettered); one HINCRBY per script call. The first
  count of a minute deletes the fields 61 to 121 minutes old and sets the hash to expire 61
  minutes later, so it holds at most about two hours of minutes. ]]

-- count n jobs of kind ('c' completed, 'f' dead-lettered) into this minute's bucket
local function tally(kind, n, now)
  local tp = BASE .. 'tp'
  local minute = math.floor(now / 60000)
  if call('HINCRBY', tp, kind .. ':' .. minute, n) == n then
    local old = {}
    for m = minute - 121, minute - 61 do old[#old + 1] = kind .. ':' .. m end
    call('HDEL', tp, unpack(old))
    call('PEXPIRE', tp, 3660000)
  end
end

-- a job given back (retry, release): runnable after delay ms (0: now), by the server's clock
local function requeue(id, jk, delay, now, pr, g, front)
  BL.count(call('HGET', jk, 't'), 1)
  if delay > 0 then
    call('HSET', jk, 's', 'scheduled', 'due', now + delay)
    call('ZADD', K_SCHED, now + delay, id)
  else
    call('HSET', jk, 's', 'queued')
    push_ready(id, pr, front, g)
  end
end

-- finish active jobs with their results, fenced by lease tokens: n groups of 4 values (id,
-- token, result, result_ttl_ms) from ARGV[first]; returns one code per job (see complete.lua).
-- The loop is the per-job cost of a drain: what is the same for every job (the key prefix, the
-- time as a string) is made once, and what a plain job lacks (a group, a lock, options, an
-- awaiting caller, a batch, dependents, extras) costs it one test each
local function do_complete(first, n, now)
  check_count(n)
  local out = {}
  local ok = 0
  local done = {}
  local kept = {}  -- the completed ones whose record is kept: the completed index
  local held = {}  -- worker -> its jobs finished here
  local groups, freed = {}, {}  -- the groups of the jobs finished here, and how many each
  local tasks, per_task = {}, {}  -- the tasks of the jobs finished here, and how many each
  local jp, at = BASE .. 'job:', string.format('%d', now)
  -- qconf's fields it reads: events (lib/events) and the default group limit (release_slots)
  local events, glimit = false, nil
  if n > 0 then
    local qc = call('HMGET', K_QCONF, 'events', 'glimit')
    events, glimit = events_on(qc[1] or false), qc[2]
    DQ.telling()
  end
  for i = 1, n do
    local b = first + (i - 1) * 4
    local id, tok, res, ttl = ARGV[b], ARGV[b + 1], ARGV[b + 2], tonumber(ARGV[b + 3])
    local jk = jp .. id
    -- (its attempt, 'a', only for the events: each field read costs about as much as a
    -- quarter of the record's HSET)
    local r
    if events then
      r = call('HMGET', jk, 's', 'l', 'g', 'w', 'b', 'wk', 'uk', 't', 'xk', 'dd', 'o', 'a')
    else
      r = call('HMGET', jk, 's', 'l', 'g', 'w', 'b', 'wk', 'uk', 't', 'xk', 'dd', 'o')
    end
    local s = r[1]
    if s == 'active' and r[2] == tok then
      done[#done + 1] = id
      local wk = r[6]
      if wk and wk ~= '' then
        local h = held[wk]
        if not h then h = {}; held[wk] = h end
        h[#h + 1] = id
      end
      local g = r[3]
      if g and g ~= '' then
        if not freed[g] then groups[#groups + 1] = g; freed[g] = 0 end
        freed[g] = freed[g] + 1
      end
      local t = r[8] or ''
      local c = per_task[t]
      if not c then tasks[#tasks + 1] = t; c = 0 end
      per_task[t] = c + 1
      if r[7] then unlock(id, r[7]) end
      if r[11] then LIM.limits_done(r[11], jk, true) end
      call('HSET', jk, 's', 'completed', 'r', res, 'f', at)
      if events then emit_add('completed', id, r[8], r[12], wk) end
      if r[4] then announce(jk, id) end
      -- its batch, if any, and its dependents (dd); a job of no batch tells its dependents
      -- straight away (batch_outcome would read its record again)
      local fwd = false
      if r[5] then fwd = batch_outcome(id, jk, true, res, now)
      elseif r[10] then fwd = deps_outcome(id, true, now, dep_kept(r[8], res), r[10]) end
      if r[9] then follow_record(id, r[9], ttl) end
      if ttl == 0 then
        call('DEL', jk)
      else
        if ttl > 0 then call('PEXPIRE', jk, ttl) end
        kept[#kept + 1] = id
      end
      ok = ok + 1
      out[i] = fwd and 2 or 1
    elseif not s then
      out[i] = -1
    elseif s == 'completed' and r[2] == tok then
      out[i] = 1
    else
      out[i] = -2
    end
  end
  -- the dependents their completions released (a fan-in's dependent counts them together)
  DQ.told(now)
  -- their groups' slots freed together (a freed slot may make a parked group runnable)
  release_slots(groups, freed, glimit)
  if ok > 0 then
    call('ZREM', K_ACTIVE, unpack(done))
    index_finished(K_COMPLETED, now, kept)
    for wid, ids in pairs(held) do unhold(wid, unpack(ids)) end
    call('HINCRBY', K_STATS, 'completed', ok)
    tally('c', ok, now)
    trend('c', tasks, per_task, now)
    -- a freed group slot may have made a parked group runnable
    if has_ready() then wake() end
  end
  emit_flush()
  return out
end
