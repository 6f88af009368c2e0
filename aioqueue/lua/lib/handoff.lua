--[[ handoff: an idle worker's fast path, enqueue's side. enqueue claims new jobs for parked
  workers on their behalf (hand_off, through do_claim: every QoS rule applies) and pushes the
  leases, CLAIMED_JOB_VALUES values per job as in claim's reply, onto the worker's hand list,
  so a job reaches an idle worker in one hop.
  Needs: core, lanes (has_ready), parking (park, unregister, hand_key), workers
  (registration_fresh), leasing (do_claim, holder). ]]

-- the parked worker to hand jobs to next: among the (at most 16) whose parking ends last, the
-- first with a fresh registration (see lib/workers) and nothing waiting in its hand list, else
-- the first with a fresh registration. A worker whose registration ran out is dead: its
-- parking is dropped. Parkings that ran out (a worker that died parked) are dropped once they
-- reach the head, i.e. once every one left has run out; reap drops them all the while
local function pick_parked(now)
  local heads = call('ZRANGE', K_IDLE, 0, 15, 'REV', 'WITHSCORES')
  if #heads == 0 then return nil end
  if tonumber(heads[2]) <= now then
    call('DEL', K_IDLE, K_IDLEW)
    return nil
  end
  local busy = nil
  for i = 1, #heads, 2 do
    local wid = heads[i]
    if tonumber(heads[i + 1]) <= now then break end
    if not registration_fresh(wid, now) then
      unregister(wid)
    elseif call('EXISTS', hand_key(wid)) == 0 then
      return wid
    elseif not busy then
      busy = wid
    end
  end
  return busy
end

-- runnable jobs have just been added: lease them to parked workers (see pick_parked; a worker
-- with room left stays parked; has_ready() ends the loop when none remain)
local function hand_off(now)
  while true do
    -- the busy case (nobody parked) costs one command
    local wid = pick_parked(now)
    if not wid then return end
    local reg = call('HGET', K_IDLEW, wid) or ''
    local want, lease, dead_ttl, nonce = string.match(reg, '^(%d+) (%d+) (%d+) (%w+)$')
    -- (numbers past MAX_COUNT: a garbage registration, as one that does not parse)
    if want then want, lease, dead_ttl = count_of(want), count_of(lease), count_of(dead_ttl) end
    if not (lease and dead_ttl) then want = nil end
    local taken = 0
    if want then
      local out = do_claim(want, lease, dead_ttl, now, true,
        holder(wid, nonce))
      taken = (#out - 2) / CLAIMED_JOB_VALUES  -- after now and the next wake-up
      if taken > 0 then
        local hk = hand_key(wid)
        call('RPUSH', hk, unpack(out, 3))
        call('PEXPIRE', hk, lease)
      end
      -- nothing it may take now (a pause, a limit): neither may the others
      if taken == 0 then return end
    end
    if want and taken < want then
      -- room left: it stays parked for the rest
      park(wid, nil, want - taken, lease, dead_ttl, nonce)
    else
      unregister(wid)
    end
    if not has_ready() then return end
  end
end
