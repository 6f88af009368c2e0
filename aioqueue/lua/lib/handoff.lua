--[[ handoff: an idle worker's fast path, enqueue's side. enqueue claims new jobs for parked
  workers on their behalf (hand_off, through do_claim: every QoS rule applies) and pushes the
  leases, CLAIMED_JOB_VALUES values per job as in claim's reply, onto the worker's hand list,
  so a job reaches an idle worker in one hop.
  Needs: core, lanes (has_ready), parking (park, unregister, hand_key), leasing (do_claim). ]]

-- runnable jobs have just been added: lease them to parked workers, the one whose parking ends
-- last first (a worker with room left stays parked; has_ready() ends the loop when none remain).
-- Registrations that ran out (a worker that died parked) are dropped once they reach the head,
-- i.e. once every registration left has run out; reap drops them all the while.
local function hand_off(now)
  while true do
    -- the busy case (nobody parked) costs one command
    local head = call('ZRANGE', K_IDLE, -1, -1, 'WITHSCORES')
    if #head == 0 then return end
    local wid = head[1]
    if tonumber(head[2]) <= now then
      call('DEL', K_IDLE, K_IDLEW)
      return
    end
    local reg = call('HGET', K_IDLEW, wid) or ''
    local want, lease, dead_ttl = string.match(reg, '^(%d+) (%d+) (%d+)$')
    local taken = 0
    if want then
      want = tonumber(want)
      local out = do_claim(want, tonumber(lease), tonumber(dead_ttl), now, true)
      taken = (#out - 2) / CLAIMED_JOB_VALUES  -- after now and the next wake-up
      if taken > 0 then
        local hk = hand_key(wid)
        call('RPUSH', hk, unpack(out, 3))
        call('PEXPIRE', hk, tonumber(lease))
      end
      -- nothing it may take now (a pause, a limit): neither may the others
      if taken == 0 then return end
    end
    if want and taken < want then
      -- room left: it stays parked for the rest
      park(wid, nil, want - taken, lease, dead_ttl)
    else
      unregister(wid)
    end
    if not has_ready() then return end
  end
end
