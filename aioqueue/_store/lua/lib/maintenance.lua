--[[ maintenance: what time does to a queue; leases that ran out are handed back (recover),
  delayed jobs that fell due and groups whose rate window passed become servable (promote),
  and when a consumer that found nothing should look again (next_wake).
  Needs: core, events (emit_job), lanes (push_ready, activate, release_slot), limiters
  (limits_done, release_held, K_LWAIT), batches (batch_outcome, to_cancelled),
  deadletter (to_dead, dead_if_corrupt), history (end_attempt). ]]

-- recovered jobs after the first are spread this far apart (and at most this many steps), so
-- the jobs a lost worker held are not claimed again as one block beside the job that killed it
local SPREAD_MS, SPREAD_STEPS = 100, 50

-- hand back one active job whose holder is gone (its lease ran out, or its worker was buried;
-- the caller took it out of active): requeue it, or dead-letter it when it has used up its
-- attempts. unstarted: its holder never started it, so the attempt is refunded (at most
-- max_attempts refunds per job, so a job that kills every worker still dies: I5). k: its place
-- among the jobs recovered together (0 runnable now, then SPREAD_MS apart). why: the
-- outcome its history records ('expired': its lease ran out; 'buried': its worker was
-- declared dead). Returns 'dead', 'cancelled', 'queued' or nil (it was not active)
local function recover_job(id, now, dead_ttl, unstarted, k, why)
  local jk = job_key(id)
  local r = call('HMGET', jk, 's', 'a', 'm', 'pr', 'g', 'x', 'wk', 'rf', 'uk', 'o', 't')
  if dead_if_corrupt(id, jk, r[1], now, dead_ttl) then return 'dead' end
  if r[1] ~= 'active' then return nil end
  unhold(r[7], id)
  if r[10] then LIM.limits_done(r[10], jk) end
  if r[6] then why = 'cancelled' end
  end_attempt(jk, r[2], r[7], why, nil, now)
  release_slot(r[5])
  local a, m = REC.attempts(r[2], r[3])
  if r[6] then
    -- cancelled while its holder was lost: it stays cancelled, it is not run again
    unlock(id, r[9])
    local err = cjson.encode({type = 'Cancelled', message = 'cancelled while running'})
    to_cancelled(id, jk, err, now, dead_ttl)
    return 'cancelled'
  end
  local rf = count_of(r[8]) or 0
  if unstarted and a > 0 and rf < m then
    a = a - 1
    call('HSET', jk, 'a', a, 'rf', rf + 1)
  end
  -- the lost holder's token no longer counts, not even as a resent ack
  call('HDEL', jk, 'l')
  if a >= m then
    to_dead(id, jk, now, cjson.encode({type = 'LeaseExpired',
      message = 'lease expired on attempt ' .. a .. ' of ' .. m .. ' (worker lost)'}), dead_ttl)
    return 'dead'
  end
  BL.count(r[11], 1)
  if k > 0 then
    -- rc: when it falls due it goes to the front of its lane, as the first one does now
    local due = now + math.min(k, SPREAD_STEPS) * SPREAD_MS
    call('HSET', jk, 's', 'scheduled', 'due', due, 'rc', 1)
    call('ZADD', K_SCHED, due, id)
  else
    call('HSET', jk, 's', 'queued')
    push_ready(id, r[4], true, r[5])
  end
  emit_job('recovered', id, jk, why)
  return 'queued'
end

-- count what recover_job did to jobs recovered together, in the stats
local function count_recovered(results)
  local dead, cancelled = 0, 0
  for _, what in ipairs(results) do
    if what == 'dead' then dead = dead + 1 elseif what == 'cancelled' then cancelled = cancelled + 1 end
  end
  call('HINCRBY', K_STATS, 'expired', #results)
  if dead > 0 then call('HINCRBY', K_STATS, 'failed', dead) end
  if cancelled > 0 then call('HINCRBY', K_STATS, 'cancelled', cancelled) end
  if #results > dead + cancelled then wake() end
end

-- the last ordinal among worker wid's leases that it has started (see lib/workers), or nil
-- when that is not known
local function started_upto(wid, cache)
  if not wid or wid == '' then return nil end
  local v = cache[wid]
  if v == nil then
    v = num(call('HGET', worker_key(wid), 'sn'), false)
    cache[wid] = v
  end
  return v or nil
end

-- hand back jobs whose lease ran out (their worker died or hung): requeue, or dead-letter
-- those that have used up their attempts; a job its worker is known not to have started gets
-- its attempt back. Jobs of workers are spread (see recover_job); a pull-API consumer's go
-- back to the front of their lanes at once. Returns how many were recovered
local function recover(now, limit, dead_ttl)
  limit = math.min(limit, MAX_JOBS_PER_CALL)
  local ids = call('ZRANGEBYSCORE', K_ACTIVE, '-inf', now, 'LIMIT', 0, limit)
  if #ids == 0 then return 0 end
  call('ZREM', K_ACTIVE, unpack(ids))
  local results, cache = {}, {}
  local k = 0
  for _, id in ipairs(ids) do
    local w = call('HMGET', job_key(id), 'wk', 'wn')
    local upto = started_upto(w[1], cache)
    local wn = num(w[2], nil)
    local spread = 0
    if w[1] and w[1] ~= '' then spread = k end
    local what = recover_job(id, now, dead_ttl, upto ~= nil and wn ~= nil and wn > upto, spread,
      'expired')
    if what == 'queued' and spread == k then k = k + 1 end
    results[#results + 1] = what or 'gone'
  end
  count_recovered(results)
  return #ids
end

-- make delayed jobs that are due runnable, groups whose rate window passed servable again,
-- and jobs whose limits may admit them now go back to their lanes (release_held)
-- (held false: the caller releases the held jobs itself, see do_claim)
local function promote(now, limit, held)
  limit = math.min(limit, MAX_JOBS_PER_CALL)
  if held ~= false then LIM.release_held(now) end
  local groups = call('ZRANGEBYSCORE', K_GWAIT, '-inf', now, 'LIMIT', 0, limit)
  if #groups > 0 then
    call('ZREM', K_GWAIT, unpack(groups))
    for _, g in ipairs(groups) do activate(g) end
  end
  local ids = call('ZRANGEBYSCORE', K_SCHED, '-inf', now, 'LIMIT', 0, limit)
  if #ids == 0 then return #groups end
  for _, id in ipairs(ids) do
    local jk = job_key(id)
    local r = call('HMGET', jk, 's', 'pr', 'g', 'rc')
    if r[1] == 'scheduled' then
      call('HSET', jk, 's', 'queued')
      if r[4] then call('HDEL', jk, 'rc') end
      push_ready(id, r[2], r[4] ~= false, r[3])
    end
  end
  call('ZREM', K_SCHED, unpack(ids))
  return #ids + #groups
end

-- the earliest instant at which a consumer that found nothing should look again: the next
-- due delayed job, lease to run out, rate window to open or limit to admit a waiting job; -1
-- when there is none
-- (lw: jobs wait aside on limits in this queue, see release_held)
local function next_wake(lw)
  local best = -1
  for _, k in ipairs({K_SCHED, K_ACTIVE, K_GWAIT, lw and K_LWAIT or nil}) do
    local s = call('ZRANGE', k, 0, 0, 'WITHSCORES')
    if s[2] and (best < 0 or tonumber(s[2]) < best) then best = tonumber(s[2]) end
  end
  return best
end
