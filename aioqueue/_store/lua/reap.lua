--[[ reap: queue maintenance, safe to run from any number of processes at once: bury workers
  that missed their heartbeats (their leases are handed back at once, see lib/workers), hand
  back expired leases, promote due delayed jobs, drop dead letters older than their retention,
  the parking of workers that died parked, and the oldest entries of the indexes of finished
  jobs whose record has expired (see drop_expired).
  With a lock period, only the first caller in each period does the work, so N workers do it
  once, not N times.
  KEYS[1..13] the shared transition keys (see lib/core)   KEYS[14] the maintenance lock
  ARGV[1] key base   ARGV[2] limit per step   ARGV[3] dead_ttl_ms (0: keep forever)
  ARGV[4] lock period ms (0: no lock, always run)
  Returns {now_ms, recovered, promoted, dead_trimmed}, or {now_ms, -1, -1, -1} when another
  process holds the lock for this period (recovered counts the leases of buried workers too) ]]
local limit, dead_ttl, lock_ms = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
if lock_ms > 0 and not call('SET', KEYS[14], '1', 'NX', 'PX', lock_ms) then
  return {now, -1, -1, -1}
end
local rec = bury_dead(now, dead_ttl, 10) + recover(now, limit, dead_ttl)
local pro = promote(now, limit)
if pro > 0 then wake() end
-- parking registrations that ran out (workers that died parked)
local stale = call('ZRANGEBYSCORE', K_IDLE, '-inf', now, 'LIMIT', 0, MAX_JOBS_PER_CALL)
if #stale > 0 then unregister(unpack(stale)) end

-- drop the oldest entries of an index of finished jobs whose record has expired, so that it
-- shrinks with the records: at most limit examined, stopping after 10 whose record is kept
-- (records kept longer than the others, e.g. forever, do not make every reap scan far)
local function drop_expired(key)
  local kept, seen = 0, 0
  while seen < limit do
    local ids = call('ZRANGE', key, kept, kept + 99)
    if #ids == 0 then return end
    for _, id in ipairs(ids) do
      seen = seen + 1
      if call('EXISTS', job_key(id)) == 1 then
        kept = kept + 1
        if kept >= 10 then return end
      else
        call('ZREM', key, id)
      end
    end
  end
end
drop_expired(K_COMPLETED)
drop_expired(K_CANCELLED)

-- waiting jobs whose dependency ended without telling them (lib/deps: DQ.sweep)
DQ.sweep(now, 10, 20)
emit_flush()

local trimmed = 0
if dead_ttl > 0 then trimmed = call('ZREMRANGEBYSCORE', K_DEAD, '-inf', now - dead_ttl) end
return {now, rec, pro, trimmed}
