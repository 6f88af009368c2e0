--[[ workers: the worker registry. A worker registers on each queue it consumes and renews its
  registration with every heartbeat (beat.lua): base.."workers" ZSET wid -> the deadline by
  which its next heartbeat must come (server ms), base.."worker:"..wid HASH what it is (host,
  pid, ver, queues, conc, st started ms, beat last beat ms, done, failed) and its lease
  counters (ln: leases it was given, sn: the ordinal up to which it has started them),
  base.."worker:"..wid..":jobs" SET the jobs leased to it. Every lease records its worker in
  the job (wk) with its ordinal (wn): the worker starts its jobs in the order it gets them.
  A worker past its deadline is dead: the next heartbeat of a live worker (beat.lua), the next
  claim, or reap, buries it (bury): its leases are handed back at once instead of when they run
  out, and the jobs it never started (still in its hand list, or with an ordinal past what it
  reported started) get their attempt back.
  Needs: core, events (emit), maintenance (recover_job, count_recovered),
  parking (hand_key, unregister). ]]

-- bury worker wid: hand back the jobs it held (at most MAX_JOBS_PER_CALL of them a call; the
-- rest at the next call) and, once none is left, drop its registration. Returns how many
-- jobs were handed back
local function bury(wid, now, dead_ttl)
  emit('worker_down', '', nil, nil, wid, 'dead')
  local hk = hand_key(wid)
  local unstarted = {}
  local hand = call('LRANGE', hk, 0, -1)
  for i = 1, #hand, CLAIMED_JOB_VALUES do unstarted[hand[i]] = true end
  call('DEL', hk)
  unregister(wid)
  local sn = num(call('HGET', worker_key(wid), 'sn'), 0)
  local ids = call('SPOP', held_key(wid), MAX_JOBS_PER_CALL)
  local results = {}
  local k = 0
  for _, id in ipairs(ids) do
    local r = call('HMGET', job_key(id), 's', 'wk', 'wn')
    if r[1] == 'active' and r[2] == wid then
      call('ZREM', K_ACTIVE, id)
      local what = recover_job(id, now, dead_ttl, unstarted[id] or num(r[3], 0) > sn, k,
        'buried')
      if what == 'queued' then k = k + 1 end
      results[#results + 1] = what or 'gone'
    end
  end
  if #results > 0 then count_recovered(results) end
  if call('EXISTS', held_key(wid)) == 0 then
    call('ZREM', K_WORKERS, wid)
    call('DEL', worker_key(wid))
    call('HINCRBY', K_STATS, 'buried', 1)
  end
  return #results
end

-- bury up to n workers that missed their heartbeat deadline; returns how many jobs were
-- handed back
local function bury_dead(now, dead_ttl, n)
  local dead = call('ZRANGEBYSCORE', K_WORKERS, '-inf', now, 'LIMIT', 0, n)
  local total = 0
  for _, wid in ipairs(dead) do total = total + bury(wid, now, dead_ttl) end
  return total
end

-- a fresh registration: its deadline is still ahead (a worker that never registered, e.g. one
-- driven by hand in tests, counts as fresh: only a registration that ran out is not)
local function registration_fresh(wid, now)
  local deadline = tonumber(call('ZSCORE', K_WORKERS, wid))
  return deadline == nil or deadline > now
end
