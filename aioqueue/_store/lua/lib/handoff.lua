--[[ handoff: an idle worker's fast path, enqueue's side. enqueue claims new jobs for parked
  workers on their behalf (hand_off, through do_claim: every QoS rule applies) and pushes the
  leases, CLAIMED_JOB_VALUES values per job as in claim's reply, onto the worker's hand list,
  so a job reaches an idle worker in one hop.
  Needs: core, lanes (has_ready), parking (unregister, hand_key), workers
  (registration_fresh), leasing (do_claim, holder). ]]

-- the parked worker to hand jobs to next: among the (at most 16) whose parking ends last, the
-- first with a fresh registration (see lib/workers) and nothing waiting in its hand list. A
-- worker whose registration ran out is dead: its parking is dropped. Parkings that ran out (a
-- worker that died parked) are dropped once they reach the head, i.e. once every one left has
-- run out; reap drops them all the while. The second value: it is the only parked worker
local function pick_parked(now)
  local heads = call('ZRANGE', K_IDLE, 0, 15, 'REV', 'WITHSCORES')
  if #heads == 0 then return nil end
  if tonumber(heads[2]) <= now then
    call('DEL', K_IDLE, K_IDLEW)
    return nil
  end
  for i = 1, #heads, 2 do
    local wid = heads[i]
    if tonumber(heads[i + 1]) <= now then return nil end
    if not registration_fresh(wid, now) then
      unregister(wid)
    elseif call('EXISTS', hand_key(wid)) == 0 then
      return wid, #heads == 2
    end
  end
  return nil
end

-- runnable jobs have just been added: lease them to parked workers (see pick_parked), at most
-- one hand-off per parking: a worker handed jobs leaves the parking and parks again only with
-- its own next claim, which a worker that died never makes, so a dead worker gets at most one
-- hand-off before it is known dead (and none after). What no parked worker takes stays in its
-- lane, with a wake token (enqueue), for the next claim. Returns whether runnable jobs remain
-- (nil: not known, ask has_ready), which also ends the loop.
-- A worker handed jobs claims again as soon as it has taken them, and that claim's reply
-- tells it when the new leases run out (next_wake): when it is the only parked worker, the
-- hand-off leaves no wake token for that (do_claim, h.alone), which would only wake it for
-- one more claim
local function hand_off(now)
  while true do
    -- the busy case (nobody parked) costs one command
    local wid, alone = pick_parked(now)
    if not wid then return nil end
    local reg = call('HGET', K_IDLEW, wid) or ''
    local want, lease, dead_ttl, nonce = string.match(reg, '^(%d+) (%d+) (%d+) (%w+)$')
    -- (numbers past MAX_COUNT: a garbage registration, as one that does not parse)
    if want then want, lease, dead_ttl = count_of(want), count_of(lease), count_of(dead_ttl) end
    if not (lease and dead_ttl) then want = nil end
    local more
    if want then
      local h = holder(wid, nonce)
      h.alone = alone
      local out
      out, more = do_claim(want, lease, dead_ttl, now, true, h)
      -- nothing it may take now (a pause, a limit): neither may the others; it stays parked
      if #out == 2 then return more end
      local hk = hand_key(wid)
      call('RPUSH', hk, unpack(out, 3))
      call('PEXPIRE', hk, lease)
    else
      more = has_ready()
    end
    unregister(wid)
    if not more then return false end
  end
end
