--[[ replace: a unique job's conflict resolved by changing the job that holds the lock, while it
  still waits (queued or scheduled): its arguments (payload and options, made for its id) and,
  to debounce, its due time, pushed back to the new call's delay from now (or its at); a
  debounce also restarts the lock's TTL. Atomic with the lock's check, so it never changes a
  job that has started or that no longer holds the lock.
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] unique key   ARGV[3] holder's job id   ARGV[4] payload
  ARGV[5] options JSON ('' none)   ARGV[6] debounce delay ms (-1 none)   ARGV[7] debounce at
  ms (-1 none; both -1: replace the arguments only)   ARGV[8] the lock's TTL ms
  Returns 1 replaced, 0 the holder no longer waits (it started or finished: nothing changed),
  -1 the lock no longer names the holder (the caller enqueues again) ]]
local key, id = BASE .. 'unique:' .. ARGV[2], ARGV[3]
if call('GET', key) ~= id then return -1 end
local jk = job_key(id)
local r = call('HMGET', jk, 's', 'g', 'pr')
local s = r[1]
if s ~= 'queued' and s ~= 'scheduled' then return 0 end
call('HSET', jk, 'p', ARGV[4])
if ARGV[5] ~= '' then call('HSET', jk, 'o', ARGV[5]) else call('HDEL', jk, 'o') end
local delay, at = tonumber(ARGV[6]), tonumber(ARGV[7])
if delay < 0 and at < 0 then return 1 end
local now = now_ms()
local due = at
if delay >= 0 then due = now + delay end
call('PEXPIRE', key, ARGV[8])
if due > now then
  if s == 'queued' then leave_lane(id, r[2], r[3]) end
  call('HSET', jk, 's', 'scheduled', 'due', due)
  call('ZADD', K_SCHED, due, id)
  wake()
elseif s == 'scheduled' then
  call('ZREM', K_SCHED, id)
  call('HDEL', jk, 'due')
  call('HSET', jk, 's', 'queued')
  push_ready(id, r[3], false, r[2])
  wake()
end
return 1
