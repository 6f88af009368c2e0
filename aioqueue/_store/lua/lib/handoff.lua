--[[ handoff: an idle worker's fast path, enqueue's side. enqueue claims new jobs for parked
  workers on their behalf (hand_off, through do_claim: every QoS rule applies) and pushes the
  leases, CLAIMED_JOB_VALUES values per job as in claim's reply, onto the worker's hand list,
  so a job reaches an idle worker in one hop.
  Needs: core, lanes (has_ready), parking (unregister, hand_key), workers
  (registration_fresh), leasing (do_claim, holder). ]]

-- the hand-off's helpers (a table: the library's top level is near Lua's 200 locals)
local HO = {}

-- the parkings that end last (at most 16): worker id, end, ...
function HO.heads() return call('ZRANGE', K_IDLE, 0, 15, 'REV', 'WITHSCORES') end

-- the parked worker to hand jobs to next: among the (at most 16) whose parking ends last, the
-- first with a fresh registration (see lib/workers) and nothing waiting in its hand list. A
-- worker whose registration ran out is dead: its parking is dropped. Parkings that ran out (a
-- worker that died parked) are dropped once they reach the head, i.e. once every one left has
-- run out; reap drops them all the while. The second value: it is the only parked worker.
-- heads: HO.heads, when the caller has just read them
local function pick_parked(now, heads)
  heads = heads or HO.heads()
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

-- a parked worker's registration (base.."idlew"): want, lease, dead_ttl, nonce; nil when it
-- does not parse (or holds numbers past MAX_COUNT: garbage)
function HO.terms(wid)
  local reg = call('HGET', K_IDLEW, wid) or ''
  local want, lease, dead_ttl, nonce = string.match(reg, '^(%d+) (%d+) (%d+) (%w+)$')
  if want then want, lease, dead_ttl = count_of(want), count_of(lease), count_of(dead_ttl) end
  if not (want and lease and dead_ttl) then return nil end
  return want, lease, dead_ttl, nonce
end

-- push a hand-off's leases (do_claim's reply out) on worker wid's hand list, which its
-- blocking wait pops; it lives as long as the leases
function HO.over(wid, out, lease)
  local hk = hand_key(wid)
  call('RPUSH', hk, unpack(out, 3))
  call('PEXPIRE', hk, lease)
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
-- one more claim. first: {wid, alone}, the parked worker pick_parked has just given (HO.direct),
-- served first without picking it again
local function hand_off(now, first)
  while true do
    -- the busy case (nobody parked) costs one command
    local wid, alone
    if first then wid, alone, first = first[1], first[2], nil else wid, alone = pick_parked(now) end
    if not wid then return nil end
    local want, lease, dead_ttl, nonce = HO.terms(wid)
    local more
    if want then
      local out
      out, more = do_claim(want, lease, dead_ttl, now, true, holder(wid, nonce, alone))
      -- nothing it may take now (a pause, a limit): neither may the others; it stays parked
      if #out == 2 then return more end
      HO.over(wid, out, lease)
    else
      more = has_ready()
    end
    unregister(wid)
    if not more then return false end
  end
end

-- enqueue's new plain jobs (ids, in order), before they are pushed on the ready list: when
-- nothing else is runnable (no lane in the ring, the list empty), the first ones go straight
-- to a parked worker, as hand_off would hand them after the push (the same jobs in the same
-- order, every term of do_claim applied), without their trip through the list and the ring.
-- Returns how many of ids it took from the front (leased, or set aside by lease_jobs), which
-- the caller pushes the rest after, and where hand_off starts: false when no worker is parked
-- (no hand_off needed: the busy case costs one command, as hand_off's), the worker it picked
-- ({wid, alone}: hand_off's first) when it handed it nothing, true (pick) when it did. The
-- jobs' backlog counts are added to the caller's (tasks, counts: see BL.note), which it writes
-- after: a job enqueued and leased at once is never counted. (A registration that does not
-- parse is left to hand_off.) heads: the parkings, when the caller has read them (pick_parked)
function HO.direct(ids, now, tasks, counts, heads)
  local wid, alone = pick_parked(now, heads)
  if not wid then return 0, false end
  local picked = {wid, alone}
  if has_ready() or call('LLEN', K_READY) > 0 then return 0, picked end
  local want, lease, dead_ttl, nonce = HO.terms(wid)
  if not want then return 0, picked end
  local h = holder(wid, nonce, alone)
  h.tally = {tasks, counts}
  local out, _, took = do_claim(want, lease, dead_ttl, now, true, h, ids)
  -- none leased (none taken, or those taken set aside): it stays parked
  if #out == 2 then return took, picked end
  HO.over(wid, out, lease)
  unregister(wid)
  return took, true
end
