--[[ _lib: helpers prepended to every script (not a script of its own).
  Every transition script takes the same eight KEYS, in this order:
    KEYS[1] ready   KEYS[2] prio   KEYS[3] scheduled   KEYS[4] active
    KEYS[5] dead    KEYS[6] wake   KEYS[7] seq         KEYS[8] stats
  and ARGV[1] = the queue's key base ("<prefix>:{<queue>}:"), from which the keys of single jobs
  (base.."job:"..id) are built; they share the queue's hash tag, so every key
  a script touches lives in one cluster slot.
  A job hash has: t task, p payload, s state, a attempts, m max attempts, l lease token,
  pr priority (absent = 0), o options (JSON, absent = none), ct created ms, due due ms,
  r result, e error, f finished ms, w set while someone awaits the result (the
  finishing script then publishes the id on the channel base.."done"). ]]
local K_READY, K_PRIO, K_SCHED, K_ACTIVE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_DEAD, K_WAKE, K_SEQ, K_STATS = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local BASE = ARGV[1]
-- priority p is stored in prio with score (-p * 2^44 + seq): higher first, FIFO within a level
local PRIO_SPAN = 17592186044416

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function job_key(id)
  return BASE .. 'job:' .. id
end

-- make a job runnable; front=true puts it ahead of its priority level (a returned job)
local function push_ready(id, pr, front)
  pr = tonumber(pr) or 0
  if pr == 0 then
    if front then redis.call('LPUSH', K_READY, id) else redis.call('RPUSH', K_READY, id) end
  else
    local seq = 0
    if not front then seq = redis.call('INCR', K_SEQ) % PRIO_SPAN end
    redis.call('ZADD', K_PRIO, -pr * PRIO_SPAN + seq, id)
  end
end

-- leave one token in the wake list (never more), so that one blocked consumer wakes up
local function wake()
  if redis.call('LLEN', K_WAKE) == 0 then redis.call('RPUSH', K_WAKE, '1') end
end

-- tell whoever awaits this job's result that it has finished (only if someone registered)
local function notify(id, jk)
  if redis.call('HDEL', jk, 'w') == 1 then redis.call('PUBLISH', BASE .. 'done', id) end
end

-- move a job to the dead-letter store with its reason
local function to_dead(id, jk, now, err, dead_ttl)
  redis.call('HSET', jk, 's', 'failed', 'e', err, 'f', now)
  redis.call('HDEL', jk, 'l')
  redis.call('ZADD', K_DEAD, now, id)
  if dead_ttl > 0 then redis.call('PEXPIRE', jk, dead_ttl) end
  notify(id, jk)
end

-- hand back jobs whose lease ran out (their worker died or hung): requeue, or dead-letter
-- those that have used up their attempts; returns how many were recovered
local function recover(now, limit, dead_ttl)
  local ids = redis.call('ZRANGEBYSCORE', K_ACTIVE, '-inf', now, 'LIMIT', 0, limit)
  if #ids == 0 then return 0 end
  local dead = 0
  for _, id in ipairs(ids) do
    local jk = job_key(id)
    local r = redis.call('HMGET', jk, 's', 'a', 'm', 'pr')
    if r[1] == 'active' then
      local a, m = tonumber(r[2]) or 0, tonumber(r[3]) or 1
      if a >= m then
        to_dead(id, jk, now, cjson.encode({type = 'LeaseExpired',
          message = 'lease expired on attempt ' .. a .. ' of ' .. m .. ' (worker lost)'}), dead_ttl)
        dead = dead + 1
      else
        redis.call('HSET', jk, 's', 'queued')
        redis.call('HDEL', jk, 'l')
        push_ready(id, r[4], true)
      end
    end
  end
  redis.call('ZREM', K_ACTIVE, unpack(ids))
  redis.call('HINCRBY', K_STATS, 'expired', #ids)
  if dead > 0 then redis.call('HINCRBY', K_STATS, 'failed', dead) end
  if #ids > dead then wake() end
  return #ids
end

-- make delayed jobs that are due runnable; returns how many
local function promote(now, limit)
  local ids = redis.call('ZRANGEBYSCORE', K_SCHED, '-inf', now, 'LIMIT', 0, limit)
  if #ids == 0 then return 0 end
  for _, id in ipairs(ids) do
    local jk = job_key(id)
    local r = redis.call('HMGET', jk, 's', 'pr')
    if r[1] == 'scheduled' then
      redis.call('HSET', jk, 's', 'queued')
      push_ready(id, r[2], false)
    end
  end
  redis.call('ZREM', K_SCHED, unpack(ids))
  return #ids
end

-- the earliest instant at which a consumer that found nothing should look again:
-- the next due delayed job or the next lease to run out; -1 when there is none
local function next_wake()
  local best = -1
  local s = redis.call('ZRANGE', K_SCHED, 0, 0, 'WITHSCORES')
  if s[2] then best = tonumber(s[2]) end
  local a = redis.call('ZRANGE', K_ACTIVE, 0, 0, 'WITHSCORES')
  if a[2] and (best < 0 or tonumber(a[2]) < best) then best = tonumber(a[2]) end
  return best
end

local function has_ready()
  return redis.call('LLEN', K_READY) > 0 or redis.call('ZCARD', K_PRIO) > 0
end
