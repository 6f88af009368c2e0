--[[ cancel: cancel jobs from any process. Waiting, scheduled and queued jobs become cancelled
  at once and leave their lane (LREM on the plain FIFO list is O(n) in its length); an active
  job is flagged, and its
  worker's next heartbeat (extend returns -3) stops it and records it as cancelled.
  KEYS[1..13] the shared transition keys (see _lib)
  ARGV[1] key base   ARGV[2] retention of cancelled records ms (0: forever)   ARGV[3..] job ids
  Returns {cancelled now, active ones flagged} ]]
local ttl = tonumber(ARGV[2])
local now = now_ms()
local done, flagged = 0, 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local jk = job_key(id)
  local r = redis.call('HMGET', jk, 's', 'g', 'pr')
  local s = r[1]
  if s == 'queued' or s == 'scheduled' or s == 'waiting' then
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
    batch_outcome(id, jk, false, cjson.encode({type = 'Cancelled', message = 'cancelled'}), now)
    done = done + 1
  elseif s == 'active' then
    redis.call('HSET', jk, 'x', 1)
    flagged = flagged + 1
  end
end
if done > 0 then redis.call('HINCRBY', K_STATS, 'cancelled', done) end
return {done, flagged}
