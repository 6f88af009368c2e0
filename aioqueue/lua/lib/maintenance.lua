--[[ maintenance: what time does to a queue; leases that ran out are handed back (recover),
  delayed jobs that fell due and groups whose rate window passed become servable (promote),
  and when a consumer that found nothing should look again (next_wake).
  Needs: core, lanes (push_ready, activate, release_slot), batches (batch_outcome),
  deadletter (to_dead, dead_if_corrupt). ]]

-- hand back jobs whose lease ran out (their worker died or hung): requeue, or dead-letter
-- those that have used up their attempts; returns how many were recovered
local function recover(now, limit, dead_ttl)
  limit = math.min(limit, MAX_JOBS_PER_CALL)
  local ids = call('ZRANGEBYSCORE', K_ACTIVE, '-inf', now, 'LIMIT', 0, limit)
  if #ids == 0 then return 0 end
  local dead, cancelled = 0, 0
  call('ZREM', K_ACTIVE, unpack(ids))
  for _, id in ipairs(ids) do
    local jk = job_key(id)
    local r = call('HMGET', jk, 's', 'a', 'm', 'pr', 'g', 'x')
    if dead_if_corrupt(id, jk, r[1], now, dead_ttl) then
      dead = dead + 1
    elseif r[1] == 'active' then
      local a, m = num(r[2], 0), num(r[3], 1)
      if r[6] then
        -- cancelled while its holder was lost: it stays cancelled, it is not run again
        local err = cjson.encode({type = 'Cancelled', message = 'cancelled while running'})
        call('HSET', jk, 's', 'cancelled', 'e', err, 'f', now)
        if dead_ttl > 0 then call('PEXPIRE', jk, dead_ttl) end
        announce(jk, id)
        batch_outcome(id, jk, false, err, now)
        cancelled = cancelled + 1
      elseif a >= m then
        call('HDEL', jk, 'l')
        to_dead(id, jk, now, cjson.encode({type = 'LeaseExpired',
          message = 'lease expired on attempt ' .. a .. ' of ' .. m .. ' (worker lost)'}), dead_ttl)
        dead = dead + 1
      else
        -- the expired holder's token no longer counts, not even as a resent ack
        call('HSET', jk, 's', 'queued')
        call('HDEL', jk, 'l')
        push_ready(id, r[4], true, r[5])
      end
      release_slot(r[5])
    end
  end
  call('HINCRBY', K_STATS, 'expired', #ids)
  if dead > 0 then call('HINCRBY', K_STATS, 'failed', dead) end
  if cancelled > 0 then call('HINCRBY', K_STATS, 'cancelled', cancelled) end
  if #ids > dead + cancelled then wake() end
  return #ids
end

-- make delayed jobs that are due runnable, and groups whose rate window passed servable again
local function promote(now, limit)
  limit = math.min(limit, MAX_JOBS_PER_CALL)
  local groups = call('ZRANGEBYSCORE', K_GWAIT, '-inf', now, 'LIMIT', 0, limit)
  if #groups > 0 then
    call('ZREM', K_GWAIT, unpack(groups))
    for _, g in ipairs(groups) do activate(g) end
  end
  local ids = call('ZRANGEBYSCORE', K_SCHED, '-inf', now, 'LIMIT', 0, limit)
  if #ids == 0 then return #groups end
  for _, id in ipairs(ids) do
    local jk = job_key(id)
    local r = call('HMGET', jk, 's', 'pr', 'g')
    if r[1] == 'scheduled' then
      call('HSET', jk, 's', 'queued')
      push_ready(id, r[2], false, r[3])
    end
  end
  call('ZREM', K_SCHED, unpack(ids))
  return #ids + #groups
end

-- the earliest instant at which a consumer that found nothing should look again: the next
-- due delayed job, lease to run out, or rate window to open; -1 when there is none
local function next_wake()
  local best = -1
  for _, k in ipairs({K_SCHED, K_ACTIVE, K_GWAIT}) do
    local s = call('ZRANGE', k, 0, 0, 'WITHSCORES')
    if s[2] and (best < 0 or tonumber(s[2]) < best) then best = tonumber(s[2]) end
  end
  return best
end
