--[[ extend: renew the leases of active jobs (heartbeat), fenced by lease tokens.
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] lease ms from now   ARGV[3] n   then n pairs: id, lease token
  Returns {now_ms, code_1, ..., code_n}: 1 renewed, -1 no such job, -2 lease token mismatch,
  -3 renewed but cancellation was requested (see cancel.lua): stop the job and fail it with
  retry delay -2 ]]
local lease, n = tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local out = {now}
renew_leases(out, lease, now, 4, n)
return out
