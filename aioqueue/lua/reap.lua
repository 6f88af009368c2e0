--[[ reap: queue maintenance, safe to run from any number of processes at once: hand back
  expired leases, promote due delayed jobs, and drop dead letters older than their retention.
  KEYS[1..8] the shared transition keys (see _lib)
  ARGV[1] key base   ARGV[2] limit per step   ARGV[3] dead_ttl_ms (0: keep forever)
  Returns {now_ms, recovered, promoted, dead_trimmed} ]]
local limit, dead_ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local rec = recover(now, limit, dead_ttl)
local pro = promote(now, limit)
if pro > 0 then wake() end
local trimmed = 0
if dead_ttl > 0 then trimmed = redis.call('ZREMRANGEBYSCORE', K_DEAD, '-inf', now - dead_ttl) end
return {now, rec, pro, trimmed}
