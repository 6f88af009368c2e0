--[[ schedules: add, change or remove a queue's periodic schedule (any process can).
  KEYS[1] the schedules' definitions (HASH name -> JSON)   KEYS[2] their next ticks (ZSET name
  -> tick ms)
  ARGV[1] key base   ARGV[2] 'put' or 'remove'   ARGV[3] schedule name
  put: ARGV[4] definition (JSON)   ARGV[5] its first tick (ms), stored when the schedule is new
  or its definition changed (an unchanged one keeps its stored tick, so restarting the workers
  that declare it neither repeats nor skips a tick)
  Returns put: 1 added, 2 changed, 0 unchanged; remove: 1 removed, 0 no such schedule
  Garbage (I9): this script has no library parts (its keys are not a queue's transition keys),
  so it calls Redis directly; each branch reads both keys before it writes either, so a key of
  the wrong type fails the call (a typed error to the caller) before anything is changed. ]]
local name = ARGV[3]
if ARGV[2] == 'remove' then
  redis.call('ZSCORE', KEYS[2], name)
  local removed = redis.call('HDEL', KEYS[1], name)
  redis.call('ZREM', KEYS[2], name)
  return removed
end
local old = redis.call('HGET', KEYS[1], name)
if old == ARGV[4] and redis.call('ZSCORE', KEYS[2], name) then return 0 end
redis.call('HSET', KEYS[1], name, ARGV[4])
redis.call('ZADD', KEYS[2], tonumber(ARGV[5]), name)
if old then return 2 end
return 1
