--[[ complete: finish active jobs with their results, fenced by lease tokens.
  KEYS[1..13] the shared transition keys (see _lib)
  ARGV[1] key base   ARGV[2] n
  then per job 4 values: id, lease token, result (serialised), result_ttl_ms (0: drop the
  record now, -1: keep forever)
  Returns {code_1, ..., code_n}: 1 ok (also when this token already completed the job: an ack
  resent after a lost reply), -1 no such job, -2 lease token mismatch or job not active ]]
local n = tonumber(ARGV[2])
local now = now_ms()
local out = {}
local ok = 0
for i = 0, n - 1 do
  local b = 3 + i * 4
  local id, tok, ttl = ARGV[b], ARGV[b + 1], tonumber(ARGV[b + 3])
  local jk = job_key(id)
  local r = redis.call('HMGET', jk, 's', 'l', 'g')
  if not r[1] then
    out[#out + 1] = -1
  elseif r[1] == 'completed' and r[2] == tok then
    out[#out + 1] = 1
  elseif r[1] ~= 'active' or r[2] ~= tok then
    out[#out + 1] = -2
  else
    redis.call('ZREM', K_ACTIVE, id)
    release_slot(r[3])
    redis.call('HSET', jk, 's', 'completed', 'r', ARGV[b + 2], 'f', now)
    notify(id, jk)
    batch_outcome(id, jk, true, ARGV[b + 2], now)
    if ttl == 0 then
      redis.call('DEL', jk)
    elseif ttl > 0 then
      redis.call('PEXPIRE', jk, ttl)
    end
    ok = ok + 1
    out[#out + 1] = 1
  end
end
if ok > 0 then
  redis.call('HINCRBY', K_STATS, 'completed', ok)
  -- a freed group slot may have made a parked group runnable
  if has_ready() then wake() end
end
return out
