--[[ release: give active jobs back to the queue without finishing them, fenced by lease tokens
  (pull-API release, or a worker shutting down). A refunded attempt does not count toward
  max_attempts.
  KEYS[1..13] the shared transition keys (see _lib)
  ARGV[1] key base   ARGV[2] delay ms (0: runnable now, ahead of its priority level)
  ARGV[3] refund the attempt (1) or not (0)   ARGV[4] n   then n pairs: id, lease token
  Returns {code_1, ..., code_n}: 1 released (also when this token already released it: a
  resent ack), -1 no such job, -2 lease token mismatch ]]
local delay, refund, n = tonumber(ARGV[2]), ARGV[3] == '1', tonumber(ARGV[4])
local now = now_ms()
local out = {}
local any = false
for i = 0, n - 1 do
  local id, tok = ARGV[5 + i * 2], ARGV[6 + i * 2]
  local jk = job_key(id)
  local r = redis.call('HMGET', jk, 's', 'l', 'pr', 'g')
  if not r[1] then
    out[#out + 1] = -1
  elseif r[2] == tok and (r[1] == 'queued' or r[1] == 'scheduled') then
    out[#out + 1] = 1
  elseif r[1] ~= 'active' or r[2] ~= tok then
    out[#out + 1] = -2
  else
    redis.call('ZREM', K_ACTIVE, id)
    release_slot(r[4])
    if refund then redis.call('HINCRBY', jk, 'a', -1) end
    if delay > 0 then
      redis.call('HSET', jk, 's', 'scheduled', 'due', now + delay)
      redis.call('ZADD', K_SCHED, now + delay, id)
    else
      redis.call('HSET', jk, 's', 'queued')
      push_ready(id, r[3], true, r[4])
    end
    any = true
    out[#out + 1] = 1
  end
end
if any then wake() end
return out
