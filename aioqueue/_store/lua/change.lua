--[[ change: change a job that has not started (queued or scheduled): its priority, its due
  time, or both, in one step (Job.change). A queued job changed leaves its lane and joins the
  back of its (new) priority level, or the scheduled set if its new due time is in the future;
  a scheduled one moves to its new due time, or to its lane if that is not in the future. A job
  in any other state is not changed.
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] job id   ARGV[3] priority ('' unchanged; clamped to MIN_PRIORITY
  ..MAX_PRIORITY)   ARGV[4] delay ms from now (-1 none)   ARGV[5] due time, epoch ms (-1 none)
  Returns {1, state after}, {0, state found} (not changed: it started or finished), {-1} no
  such job ]]
local id = ARGV[2]
local jk = job_key(id)
local r = call('HMGET', jk, 's', 'g', 'pr')
local s = r[1]
if not s then return {-1} end
if s ~= 'queued' and s ~= 'scheduled' then return {0, s} end
local pr = r[3]
if ARGV[3] ~= '' then
  pr = tostring(math.max(MIN_PRIORITY, math.min(MAX_PRIORITY, math.floor(tonumber(ARGV[3]) or 0))))
end
local now = now_ms()
local delay, at = tonumber(ARGV[4]), tonumber(ARGV[5])
local due = nil
if delay >= 0 then due = now + delay elseif at >= 0 then due = at end
-- leave where it is
if s == 'queued' then leave_lane(id, r[2], r[3]) else call('ZREM', K_SCHED, id) end
if pr == '0' then call('HDEL', jk, 'pr') elseif pr then call('HSET', jk, 'pr', pr) end
if due == nil and s == 'scheduled' then due = num(call('HGET', jk, 'due'), now) end
if due ~= nil and due > now then
  call('HSET', jk, 's', 'scheduled', 'due', due)
  call('ZADD', K_SCHED, due, id)
  emit_job('changed', id, jk, nil, due)
  wake()  -- an idle consumer re-arms its wake-up for the new earliest due time
  return {1, 'scheduled'}
end
call('HDEL', jk, 'due')
call('HSET', jk, 's', 'queued')
push_ready(id, pr, false, r[2])
emit_job('changed', id, jk)
wake()
return {1, 'queued'}
