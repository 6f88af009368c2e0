--[[ extend: renew the leases of active jobs (heartbeat), fenced by lease tokens.
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] lease ms from now   ARGV[3] n   then n pairs: id, lease token
  Returns {now_ms, code_1, ..., code_n}: 1 renewed, -1 no such job, -2 lease token mismatch,
  -3 renewed but cancellation was requested (see cancel.lua): stop the job and fail it with
  retry delay -2 ]]
local lease, n = tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local out = {now}
local first = call('ZRANGE', K_ACTIVE, 0, 0, 'WITHSCORES')
local earliest = tonumber(first[2])
for i = 0, n - 1 do
  local id, tok = ARGV[4 + i * 2], ARGV[5 + i * 2]
  local r = call('HMGET', job_key(id), 's', 'l', 'x')
  if not r[1] then
    out[#out + 1] = -1
  elseif r[1] ~= 'active' or r[2] ~= tok then
    out[#out + 1] = -2
  else
    call('ZADD', K_ACTIVE, 'XX', now + lease, id)
    if r[3] then out[#out + 1] = -3 else out[#out + 1] = 1 end
  end
end
-- a lease shortened below every other one: wake an idle consumer to re-arm its wake-up
if earliest and now + lease < earliest then wake() end
return out
