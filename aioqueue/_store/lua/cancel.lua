--[[ cancel: cancel jobs from any process. Waiting, scheduled and queued jobs become cancelled
  at once and leave their lane (see cancel_waiting in lib/lanes); an active job is flagged, and its
  worker's next heartbeat (extend returns -3) stops it and records it as cancelled.
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] retention of cancelled records ms (0: forever)   ARGV[3..] job ids
  Returns {cancelled now, active ones flagged} ]]
check_count(#ARGV - 2)
local ttl = tonumber(ARGV[2])
local now = now_ms()
local done, flagged = 0, 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local jk = job_key(id)
  if cancel_waiting(id, jk, now, ttl) then
    batch_outcome(id, jk, false, CANCELLED_ERROR, now)
    done = done + 1
  elseif call('HGET', jk, 's') == 'active' then
    call('HSET', jk, 'x', 1)
    flagged = flagged + 1
  end
end
if done > 0 then call('HINCRBY', K_STATS, 'cancelled', done) end
return {done, flagged}
