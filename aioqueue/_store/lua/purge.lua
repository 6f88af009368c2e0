--[[ purge: delete jobs that are not running, with their records: queued (waiting in a lane),
  scheduled, dead letters, or finished records. Active and waiting (batch callback) jobs are
  never purged: cancel them instead. A purged job that belongs to a batch is counted into the
  batch as cancelled, and whoever awaits it is told (its result then reports no such job).
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base
  ARGV[2] source: 'ids' (ARGV[5..]), or the structure whose first ARGV[4] members are purged:
          'ready', 'prio', 'scheduled', 'dead', 'completed' or 'cancelled' (the indexes of
          finished jobs, oldest first), or 'lane' (the lane of group ARGV[3])
  ARGV[3] for 'ids': the states that may be purged, space separated (of queued, scheduled,
          failed, completed, cancelled); for 'lane': the group
  ARGV[4] for a structure: how many members at most (MAX_JOBS_PER_CALL)
  ARGV[5..] for 'ids': job ids (at most MAX_JOBS_PER_CALL)
  Returns {purged, skipped} ]]
local source, arg, n = ARGV[2], ARGV[3], tonumber(ARGV[4]) or 0
local now = now_ms()
local cancelled = cjson.encode({type = 'Cancelled', message = 'purged'})
local purgeable = {queued = true, scheduled = true, failed = true, completed = true,
  cancelled = true}

-- the ids to purge, and the states allowed
local ids, allowed = {}, {}
n = math.max(0, math.min(n, MAX_JOBS_PER_CALL))
if source == 'ids' then
  check_count(#ARGV - 4)
  for i = 5, #ARGV do ids[#ids + 1] = ARGV[i] end
  for s in string.gmatch(arg, '%S+') do
    if purgeable[s] then allowed[s] = true end
  end
elseif n > 0 then
  allowed = {queued = true}
  if source == 'ready' then
    ids = call('LRANGE', K_READY, 0, n - 1)
  elseif source == 'prio' then
    ids = call('ZRANGE', K_PRIO, 0, n - 1)
  elseif source == 'lane' then
    ids = call('ZRANGE', lane_key(arg), 0, n - 1)
  elseif source == 'scheduled' then
    ids = call('ZRANGE', K_SCHED, 0, n - 1)
    allowed = {scheduled = true}
  elseif source == 'dead' then
    ids = call('ZRANGE', K_DEAD, 0, n - 1)
    allowed = {failed = true}
  elseif source == 'completed' then
    ids = call('ZRANGE', K_COMPLETED, 0, n - 1)
    allowed = {completed = true}
  elseif source == 'cancelled' then
    ids = call('ZRANGE', K_CANCELLED, 0, n - 1)
    allowed = {cancelled = true}
  else
    return redis.error_reply('unknown source ' .. tostring(source))
  end
end

local done, skipped = 0, 0
for _, id in ipairs(ids) do
  local jk = job_key(id)
  local r = call('HMGET', jk, 's', 'g', 'pr', 'b', 'uk', 'xk', 'dd', 't')
  local s = r[1]
  if s and allowed[s] then
    if s == 'queued' or s == 'scheduled' then BL.count(r[8], -1) end
    if s == 'queued' then
      if r[2] then
        call('ZREM', lane_key(r[2]), id)
      elseif lane_prio(r[3]) ~= 0 then
        call('ZREM', K_PRIO, id)
      else
        -- O(its position), within a budget: cheap at the head, where source 'ready' takes
        -- its ids
        leave_ready(id)
      end
      if r[4] or r[7] then batch_outcome(id, jk, false, cancelled, now) end
    elseif s == 'scheduled' then
      call('ZREM', K_SCHED, id)
      if r[4] or r[7] then batch_outcome(id, jk, false, cancelled, now) end
    elseif s == 'failed' then
      call('ZREM', K_DEAD, id)
    elseif s == 'completed' then
      call('ZREM', K_COMPLETED, id)
    elseif s == 'cancelled' then
      call('ZREM', K_CANCELLED, id)
    end
    announce(jk, id)
    unlock(id, r[5])
    follow_record(id, r[6], 0)
    call('DEL', jk)
    done = done + 1
  else
    -- a structure's member whose record is gone, or no longer in that state, leaves it only
    -- when the record is gone (otherwise it belongs to whatever moves the job on); an index
    -- of finished jobs only lists, so a member of another state (its record expired and the
    -- id was used again) leaves it too
    if source == 'completed' then call('ZREM', K_COMPLETED, id)
    elseif source == 'cancelled' then call('ZREM', K_CANCELLED, id)
    elseif source == 'ready' and s ~= 'queued' then
      -- no record, or one that left the list without leaving it (see leave_ready)
      leave_ready(id)
    elseif not s and source ~= 'ids' then
      if source == 'prio' then call('ZREM', K_PRIO, id)
      elseif source == 'lane' then call('ZREM', lane_key(arg), id)
      elseif source == 'scheduled' then call('ZREM', K_SCHED, id)
      elseif source == 'dead' then call('ZREM', K_DEAD, id) end
    end
    skipped = skipped + 1
  end
end
if done > 0 then call('HINCRBY', K_STATS, 'purged', done) end
return {done, skipped}
