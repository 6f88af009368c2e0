--[[ lanes: where runnable jobs wait, and the ring that serves their lanes in turn; a job
  entering its lane (push_ready) or leaving it before it started (leave_lane, cancel_waiting),
  a group's slot freed (release_slot), a lane let back into the ring (activate).
  Needs: core, events (emit_job).

  Runnable jobs without a group wait in the default lane (ready LIST for priority 0, prio ZSET
  otherwise); a group's runnable jobs wait in the ZSET base.."g:"..group.
  ring is a ZSET of the lanes that can be served now (member '' = the default lane), scored by
  turn: claim serves the lane with the lowest score, then moves it to the back. A group that
  cannot be served (paused, at its concurrency limit, out of rate) is parked: removed from the
  ring, and put back by whatever lifts the block (a job of it finishing, resume, a new limit,
  its rate window passing via gwait, a ZSET of group -> window end). So claim never looks at
  idle or blocked groups.
  qconf (queue settings): paused, rate_n, rate_ms, glimit (default group concurrency limit),
  grate_n, grate_ms (default group rate). gconf (per group): limit:<g>, rate_n:<g>, rate_ms:<g>,
  paused:<g>. gactive: group -> number of its jobs active now. ]]

-- priority p is stored with score (-p * 2^44 + seq): higher first, FIFO within a level
local PRIO_SPAN = 17592186044416

-- a lane that joins the ring takes the last turn: it waits at most one job per lane already
-- there, and a lane that empties and refills at once cannot jump ahead of waiting backlogs
local function join_ring(g)
  if not call('ZSCORE', K_RING, g) then
    call('ZADD', K_RING, call('INCR', K_SEQ), g)
  end
end

-- put a lane in the ring if it has runnable jobs and nothing blocks it; active: its group's
-- running count when the caller has just read it (nil: read here). A lane already in the ring
-- costs one lookup (the common case when a job of a busy group finishes)
local function activate(g, active)
  if g == '' then
    if call('LLEN', K_READY) > 0 or call('ZCARD', K_PRIO) > 0 then join_ring('') end
    return
  end
  if call('ZSCORE', K_RING, g) then return end
  if call('ZCARD', lane_key(g)) == 0 then return end
  local gc = call('HMGET', K_GCONF, 'paused:' .. g, 'limit:' .. g)
  if gc[1] then return end
  if call('ZSCORE', K_GWAIT, g) then return end
  -- its concurrency limit, or the queue's default one (nil: none)
  local limit = count_of(gc[2] or call('HGET', K_QCONF, 'glimit') or '')
  -- (a running count that is garbage counts as none: the claim's charge sets it aside)
  if limit and (active or count_of(call('HGET', K_GACTIVE, g)) or 0) >= limit then return end
  call('ZADD', K_RING, call('INCR', K_SEQ), g)
end

-- a job's priority (pr, as stored) as claim orders by it: a finite integer in
-- MIN_PRIORITY..MAX_PRIORITY; what decides its lane (0: the plain FIFO list)
local function lane_prio(pr)
  return math.max(MIN_PRIORITY, math.min(MAX_PRIORITY, math.floor(num(pr, 0))))
end

-- make a job runnable in its lane; front=true puts it ahead of its priority level
local function push_ready(id, pr, front, g)
  pr = lane_prio(pr)
  local seq = 0
  if not g or g == '' then
    if pr == 0 then
      if front then call('LPUSH', K_READY, id) else call('RPUSH', K_READY, id) end
    else
      if not front then seq = call('INCR', K_SEQ) % PRIO_SPAN end
      call('ZADD', K_PRIO, -pr * PRIO_SPAN + seq, id)
    end
    join_ring('')
  else
    if not front then seq = call('INCR', K_SEQ) % PRIO_SPAN end
    call('ZADD', lane_key(g), -pr * PRIO_SPAN + seq, id)
    activate(g)
  end
end

-- a job of group g left the active state: free its slot, and the group may run again
local function release_slot(g)
  if g and g ~= '' then
    local active = call('HINCRBY', K_GACTIVE, g, -1)
    if active <= 0 then
      call('HDEL', K_GACTIVE, g)
      active = 0
    end
    activate(g, active)
  end
end

-- add delta[g] to the running count of each group in groups (distinct, non-empty; at most
-- MAX_JOBS_PER_CALL) with one read and one write of gactive, given their counts as read
-- (cur; nil: read here); a count that is garbage (see count_of in lib/core) goes through
-- HINCRBY, whose guard sets it aside (see call in lib/core). Counts that fall to 0 are dropped. Returns the new counts
local function add_counts(groups, delta, cur)
  cur = cur or call('HMGET', K_GACTIVE, unpack(groups))
  local now, set, del = {}, {}, {}
  for i, g in ipairs(groups) do
    local n
    local was = count_of(cur[i])
    if was then n = was + delta[g]
    else n = call('HINCRBY', K_GACTIVE, g, delta[g]) end
    if n <= 0 then
      n = 0
      del[#del + 1] = g
    else
      set[#set + 1] = g
      set[#set + 1] = n
    end
    now[i] = n
  end
  if #set > 0 then call('HSET', K_GACTIVE, unpack(set)) end
  if #del > 0 then call('HDEL', K_GACTIVE, unpack(del)) end
  return now
end

-- jobs of these groups left the active state (freed[g] of group g; groups distinct, in the
-- order their first job left): free their slots, and each group may run again. glimit: the
-- queue's default group limit (qconf glimit) as the caller read it
local function release_slots(groups, freed, glimit)
  if #groups == 0 then return end
  local minus = {}
  for _, g in ipairs(groups) do minus[g] = -freed[g] end
  local active = add_counts(groups, minus)
  -- a freed slot lets a lane back into the ring only if a concurrency limit held it out:
  -- with no group settings (gconf) and no default limit (qconf glimit) none did, so the
  -- lanes are not looked at (one lookup a group before)
  if not glimit and call('EXISTS', K_GCONF) == 0 then return end
  -- (activate looks the lane up in the ring first: one ZSCORE while it is there; not
  -- ZMSCORE, which the least-privilege ACL of docs/security.md does not grant)
  for i, g in ipairs(groups) do activate(g, active[i]) end
end

-- the places of the plain FIFO list one call may search to take jobs out of it (LPOS and LREM
-- are O(place)); a job beyond what is left stays in the list, its record no longer queued:
-- claim drops it when it reaches the head (lease_jobs), listings skip it (I13)
local READY_SEARCH = 100000
local ready_search = READY_SEARCH -- per call

-- take id out of the plain FIFO list, within this call's search budget
local function leave_ready(id)
  if ready_search <= 0 then return end
  local at = call('LPOS', K_READY, id, 'MAXLEN', ready_search)
  if at then
    ready_search = ready_search - 2 * (at + 1)
    call('LREM', K_READY, 1, id)
  else
    ready_search = 0
  end
end

-- take a queued job (of group g, priority pr) out of its lane
local function leave_lane(id, g, pr)
  if g then
    call('ZREM', lane_key(g), id)
  elseif lane_prio(pr) ~= 0 then
    call('ZREM', K_PRIO, id)
  else
    leave_ready(id)
  end
end

-- the reason a job cancelled before it ran records (e), unless its canceller gives one
local CANCELLED_BEFORE = cjson.encode({type = 'Cancelled', message = 'cancelled before it ran'})

-- cancel a job that has not started (waiting, scheduled or queued): it leaves its lane at
-- once (see leave_lane) and records why (err, JSON; default CANCELLED_BEFORE); returns true
-- if it was cancelled
local function cancel_waiting(id, jk, now, ttl, err)
  local r = call('HMGET', jk, 's', 'g', 'pr', 'uk', 'xk', 't')
  local s = r[1]
  if s ~= 'queued' and s ~= 'scheduled' and s ~= 'waiting' then return false end
  if s ~= 'waiting' then BL.count(r[6], -1) end
  unlock(id, r[4])
  call('HSET', jk, 's', 'cancelled', 'f', now, 'e', err or CANCELLED_BEFORE)
  call('ZREM', K_SCHED, id)
  if s == 'queued' then leave_lane(id, r[2], r[3])
  elseif s == 'waiting' then call('ZREM', BASE .. 'waiting', id) end
  if ttl > 0 then
    call('PEXPIRE', jk, ttl)
    follow_record(id, r[5], ttl)
  end
  index_finished(K_CANCELLED, now, {id})
  emit_job('cancelled', id, jk, 'Cancelled')
  announce(jk, id)
  return true
end

-- some lane can be served now
local function has_ready()
  return call('ZCARD', K_RING) > 0
end
