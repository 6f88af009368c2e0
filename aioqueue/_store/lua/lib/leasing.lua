--[[ leasing: do_claim, the one claim path (claim.lua describes the order and the reply), in
  named steps: the queue's terms (pause, rate); then turn after turn of the ring, a group's
  terms (its pause, limit and rate), taking the lane's next jobs, leasing them, and ending its
  turn (charging the jobs to its group, giving the lane its next place); then the new leases,
  the queue's rate and the reply. And claim_for: a worker's claim, with its parking.
  Each lease writes its start (st) next to its worker (wk), for the job's history.
  Needs: core, events (emit_add, emit_flush), lanes (the ring, has_ready, add_counts),
  limiters (limits_check, limits_charge), batches
  (batch_outcome, to_cancelled), deadletter (dead_if_corrupt, dead_if_garbled_id), maintenance
  (recover, promote, next_wake), parking (park, unpark), workers (bury_dead). ]]

-- the queue-wide terms of a claim: want, cut to what a pause and the queue's rate allow, and a
-- table: paused, the queue's rate window (rate_key, rate_ms; nil without a rate), rate_wake
-- (when that window ends if it is used up, else -1) and the groups' defaults (glimit, grate_n,
-- grate_ms)
local function queue_terms(want, now)
  local q = call('HMGET', K_QCONF, 'paused', 'rate_n', 'rate_ms', 'glimit', 'grate_n',
    'grate_ms', 'lw')
  local qt = {paused = q[1], rate_wake = -1, lw = q[7],
    glimit = count_of(q[4] or ''), grate_n = count_of(q[5] or ''), grate_ms = count_of(q[6] or '')}
  if q[1] then want = 0 end
  local rn, rms = count_of(q[2] or ''), count_of(q[3] or '')
  if want > 0 and rn and rms and rms > 0 then
    local window = math.floor(now / rms)
    qt.rate_key, qt.rate_ms = BASE .. 'qrate:' .. window, rms
    local left = rn - (count_of(call('GET', qt.rate_key)) or 0)
    if left <= 0 then
      want = 0
      qt.rate_wake = (window + 1) * rms
    elseif left < want then
      want = left
    end
  end
  return want, qt
end

local NO_SETTINGS = {}

-- group g's terms for one turn: room, cut to what its concurrency limit and rate allow;
-- blocked when it is paused, at its limit or out of rate (wait_until: when its rate window
-- ends, nil otherwise); and, when it has a limit or a rate, what end_turn charges the jobs
-- taken to: {limit, rate_key, rate_n, rate_ms} (nil when it has neither). active: its running
-- count (gactive), read by the caller
local function group_terms(g, room, now, qt, active)
  -- every setting of the group in one read (none to read while no group has its own)
  local gc = NO_SETTINGS
  if qt.gconf then
    gc = call('HMGET', K_GCONF, 'paused:' .. g, 'limit:' .. g, 'rate_n:' .. g, 'rate_ms:' .. g)
  end
  if gc[1] then return room, true, nil, nil end
  local blocked, wait_until = false, nil
  local limit = qt.glimit
  if gc[2] then limit = count_of(gc[2]) end
  if limit then
    -- a running count that is garbage counts as none: end_turn's charge sets it aside
    active = count_of(active) or 0
    if active >= limit then
      blocked = true
    elseif limit - active < room then
      room = limit - active
    end
  end
  local rate_n, rate_ms = qt.grate_n, qt.grate_ms
  if gc[3] then rate_n = count_of(gc[3]) end
  if gc[4] then rate_ms = count_of(gc[4]) end
  if not (rate_ms and rate_ms > 0) then rate_n = nil end  -- a garbled rate is no rate
  local rate_key = nil
  if rate_n and not blocked then
    local window = math.floor(now / rate_ms)
    rate_key = BASE .. 'grate:' .. g .. ':' .. window
    local used = count_of(call('GET', rate_key)) or 0
    if used >= rate_n then
      blocked, wait_until = true, (window + 1) * rate_ms
    elseif rate_n - used < room then
      room = rate_n - used
    end
  end
  if not limit and not rate_key then return room, blocked, wait_until, nil end
  return room, blocked, wait_until, {limit = limit, rate_key = rate_key, rate_n = rate_n,
    rate_ms = rate_ms}
end

-- take up to room jobs off lane g, highest priority first (their ids: not leased yet), and
-- true when the lane is known to be empty after them
local function take(g, room)
  local ids = {}
  if g ~= '' then
    local z = call('ZPOPMIN', lane_key(g), room)
    for i = 1, #z, 2 do ids[#ids + 1] = z[i] end
    return ids, false
  end
  -- the default lane: priority above 0 (negative scores), then the plain FIFO lane, then
  -- priority below 0
  local prio = call('EXISTS', K_PRIO) == 1
  if prio then
    local hi = call('ZRANGEBYSCORE', K_PRIO, '-inf', '(0', 'LIMIT', 0, room)
    if #hi > 0 then
      call('ZREM', K_PRIO, unpack(hi))
      for _, id in ipairs(hi) do ids[#ids + 1] = id end
    end
  end
  if #ids < room then
    local plain = call('LPOP', K_READY, room - #ids)
    if plain then for _, id in ipairs(plain) do ids[#ids + 1] = id end end
    -- the plain lane ran dry, and there was no priority lane: empty
    if #ids < room and not prio then return ids, true end
  end
  if prio and #ids < room then
    local lo = call('ZPOPMIN', K_PRIO, room - #ids)
    for i = 1, #lo, 2 do ids[#ids + 1] = lo[i] end
  end
  return ids, false
end

-- expiry, a job option (in its options JSON o): no run starts after expires_at_ms, or after
-- expires_after_ms from the job's creation (server clock). Only jobs with options pay for the
-- check; a job past it is recorded as cancelled, reason Expired. Returns true if it was
local function expire_if_due(id, jk, o, now, dead_ttl)
  if not string.find(o, '"expires_', 1, true) then return false end
  local at = tonumber(string.match(o, '"expires_at_ms"%s*:%s*(%d+)'))
  if not at then
    local after = tonumber(string.match(o, '"expires_after_ms"%s*:%s*(%d+)'))
    if not after then return false end
    at = num(call('HGET', jk, 'ct'), now) + after
  end
  if now < at then return false end
  local err = cjson.encode({type = 'Expired', message = 'no run started before its expiry'})
  to_cancelled(id, jk, err, now, dead_ttl)
  call('HINCRBY', K_STATS, 'cancelled', 1)
  return true
end

-- may queued job id (options o) start now, by its limits (lib/limiters)? When it may, the
-- limits to charge once it is leased go in h.lims; when not, it waits aside, or it is
-- dead-lettered (Garbled) when its limits cannot be read
function LIM.limits_admit(id, jk, o, now, dead_ttl, h)
  h.memo = h.memo or {cfg = {}, closed = {}}
  local lims = LIM.limits_check(id, o, now, h.memo)
  if lims == 'garbled' then
    to_dead(id, jk, now, cjson.encode({type = 'Garbled', message = 'its limits cannot be read'}),
      dead_ttl)
    call('HINCRBY', K_STATS, 'failed', 1)
    return false
  end
  h.lims = lims or nil
  return lims ~= false
end

-- the next lease token of holder h (see holder): the next 16 hex digits of the claim's random
-- material (h.nonce, the worker's: 64 random bits a token, each used once, so no token, nor
-- any number of them, tells another) when it holds a token's worth for every lease the holder
-- may make (h.direct, set by do_claim); else (an older client's 32-digit nonce, or garbage)
-- '<seq>-' and half the SHA-1 of the nonce with seq's pair number (seq // 2), the nonce itself
-- never handed out (h.pair, h.digest: the last one made). h.k counts the tokens made
function REC.token(h, seq)
  local at = h.k * 16
  h.k = h.k + 1
  if h.direct then return string.sub(h.nonce, at + 1, at + 16) end
  local pair = math.floor(seq / 2)
  if h.pair ~= pair then
    h.pair, h.digest = pair, redis.sha1hex(h.nonce .. ':' .. pair)
  end
  at = (seq % 2) * 16
  return string.format('%d', seq) .. '-' .. string.sub(h.digest, at + 1, at + 16)
end

-- a queued job (record r, as lease_jobs reads it) that may not simply start: it is garbled,
-- past its expiry or held by its limits (then it is dealt with here: dead-lettered,
-- cancelled, or left waiting aside, and false is returned), or it may start after all (true,
-- its limits to charge in h.lims). Jobs without options (r[5]) and with a UTF-8 id skip it
function REC.admit(id, jk, r, now, dead_ttl, h, gone_tasks, gone)
  if dead_if_garbled_id(id, jk, r[1], now, dead_ttl) then
    call('HINCRBY', K_STATS, 'failed', 1)
    return false
  end
  if not r[5] then return true end
  if expire_if_due(id, jk, r[5], now, dead_ttl) then
    unlock(id, r[7])  -- expired: recorded, not leased
    return false
  end
  if not LIM.limits_admit(id, jk, r[5], now, dead_ttl, h) then
    -- not leased: it waits for its limits (lib/limiters), still in the backlog, or they
    -- were garbage (dead-lettered)
    if call('HGET', jk, 's') == 'queued' then BL.note(gone_tasks, gone, r[3], 1) end
    return false
  end
  return true
end

-- lease the taken jobs that are still queued to holder h ({wid, nonce, ln}: see do_claim): a
-- new token each (REC.token) and one more attempt; their CLAIMED_JOB_VALUES values go on out
-- (claim's reply), their lease deadlines on zargs, and (when leased is given) leased[i] = true
-- for the i-th of got. Anything not queued (cancelled, or its record expired) is dropped from
-- the lane here; a garbled state is dead-lettered, a job past its expiry (an option)
-- cancelled. The loop is the per-job cost of a drain: what is the same for every job (the
-- key prefix, the deadline, the time as a string) is made once, a plain job (no options, an
-- ASCII id) takes no detour. Returns how many were leased
local function lease_jobs(got, now, lease, dead_ttl, out, zargs, h, leased)
  if #got == 0 then return 0 end
  local taken = 0
  -- the tokens' sequence numbers (none for tokens of the worker's material): from the block
  -- serve_ring reserved, or drawn here
  local seq = h.seq or (h.direct and 0) or call('INCRBY', K_SEQ, #got) - #got
  -- the queued jobs that leave the backlog here (leased, expired, dead-lettered), per task;
  -- into the caller's counts when it has them (h.tally: it writes them, see HO.direct)
  local gone_tasks, gone = {}, {}
  if h.tally then gone_tasks, gone = h.tally[1], h.tally[2] end
  local waits = {}  -- task -> the longest wait of its jobs started here (ms since due)
  local earliest = {}  -- task -> the earliest creation time of its jobs started here (text)
  local jp, wid, deadline, at = BASE .. 'job:', h.wid, now + lease, string.format('%d', now)
  local nz = #zargs
  -- whether any id has a byte past ASCII (then each is looked at: REC.admit checks it is
  -- UTF-8); one pattern search for all of them costs less than one for each
  local exotic = string.find(table.concat(got), '[\128-\255]') ~= nil
  for i, id in ipairs(got) do
    local jk = jp .. id
    local r = call('HMGET', jk, 's', 'a', 't', 'p', 'o', 'm', 'uk', 'ct', 'due')
    local s = r[1]
    if s == 'queued' then BL.note(gone_tasks, gone, r[3], -1) end
    if s ~= 'queued' then
      if dead_if_corrupt(id, jk, s, now, dead_ttl) then call('HINCRBY', K_STATS, 'failed', 1) end
    elseif (r[5] or (exotic and string.find(id, '[\128-\255]')))
      and not REC.admit(id, jk, r, now, dead_ttl, h, gone_tasks, gone) then
      -- dealt with by REC.admit: not leased
    else
      seq = seq + 1
      taken = taken + 1
      if leased then leased[i] = true end
      local tok = REC.token(h, seq)
      local a, m = REC.attempts(r[2], r[6])
      a = a + 1
      -- a unique job of scope queued (uk 'q:...') frees its lock as it starts
      if r[7] and string.byte(r[7], 1) == 113 then
        unlock(id, r[7])
        call('HDEL', jk, 'uk')
      end
      if h.ln then
        h.ln = h.ln + 1
        h.ids[#h.ids + 1] = id
        call('HSET', jk, 's', 'active', 'a', a, 'l', tok, 'wk', wid, 'wn', h.ln, 'st', at)
      else
        call('HSET', jk, 's', 'active', 'a', a, 'l', tok, 'wk', wid, 'st', at)
      end
      if h.lims then
        LIM.limits_charge(h.lims, jk, tok, now)
        h.lims = nil
      end
      if events_cap ~= 0 then emit_add('started', id, r[3], a, wid) end
      local t = r[3] or ''
      -- its wait counts from its creation (ct) or, delayed, from when it was due
      local c = r[8]
      if c and not r[9] then
        -- the earliest creation per task: a time as the scripts write it (an integer's
        -- digits) compares as text, by length then digits, so num() reads only a new
        -- earliest (not each job's)
        local e = earliest[t]
        if not e or #c < #e or (#c == #e and c < e) then
          if num(c, nil) then earliest[t] = c
          elseif (waits[t] or -1) < 0 then waits[t] = 0 end
        end
      else
        local since = now - math.max(num(c, now), num(r[9], 0))
        if since > (waits[t] or -1) then waits[t] = since end
      end
      zargs[nz + 1], zargs[nz + 2] = deadline, id
      nz = nz + 2
      local n = #out
      out[n + 1], out[n + 2], out[n + 3], out[n + 4] = id, tok, a, t
      out[n + 5], out[n + 6], out[n + 7] = r[4] or '', r[5] or '', m
    end
  end
  emit_flush()
  if not h.tally then BL.many(gone_tasks, gone) end
  for t, c in pairs(earliest) do
    local since = now - tonumber(c)
    if since > (waits[t] or -1) then waits[t] = since end
  end
  BL.waited(gone_tasks, waits)
  if h.seq then h.seq = seq end
  return taken
end

-- end lane g's turn, in which taken jobs were leased and charged to its group's running count
-- (now active, see serve_ring): charge them to lim from group_terms (its limit and rate
-- window), then give the lane its next
-- turn: the back of the ring (appended to back: the moves are written together, see
-- serve_ring), or out of it when it is empty or blocked (parked until what blocks it is
-- lifted; in gwait until its rate window ends). busy: the ring had more lanes than the claim
-- could serve; a group's lane not seen to drain is then not looked at (EXISTS): one that gave
-- its last job stays in the ring until its next turn finds it empty (a lane a turn in a busy
-- drain, where most turns leave jobs behind). Returns true when it stays in the ring
local function end_turn(g, taken, drained, blocked, wait_until, lim, now, back, active, busy)
  local empty
  if g == '' then
    empty = drained or (call('LLEN', K_READY) == 0 and call('ZCARD', K_PRIO) == 0)
  else
    -- with nothing taken, the limit and the rate still allow more (or blocked is set)
    if taken > 0 then
      if lim then
        local used = 0
        if lim.rate_key then
          used = call('INCRBY', lim.rate_key, taken)
          call('PEXPIRE', lim.rate_key, 2 * lim.rate_ms)
        end
        if lim.limit and active >= lim.limit then
          blocked = true
        elseif lim.rate_key and used >= lim.rate_n then
          blocked, wait_until = true, (math.floor(now / lim.rate_ms) + 1) * lim.rate_ms
        end
      end
    end
    empty = drained or (not busy and call('EXISTS', lane_key(g)) == 0)
  end
  if empty or blocked then
    call('ZREM', K_RING, g)
    if wait_until and not empty then call('ZADD', K_GWAIT, wait_until, g) end
    return false
  end
  back[#back + 1] = g
  return true
end

-- move the lanes in back (in the order they were served) to the back of the ring: turns from
-- the sequence, one block for all of them
local function requeue_turns(back)
  if #back == 0 then return end
  local seq = call('INCRBY', K_SEQ, #back) - #back
  local args = {}
  for i, g in ipairs(back) do
    args[2 * i - 1] = seq + i
    args[2 * i] = g
  end
  call('ZADD', K_RING, unpack(args))
  for i = #back, 1, -1 do back[i] = nil end
end

-- serve the ring's lanes turn by turn until want jobs are leased or no lane can give more;
-- one job per turn while other lanes wait. The lanes due next are read together (as many as
-- jobs are still wanted) and served in that order: each lane's jobs are taken, then all of
-- them leased at once, then each lane's turn ends; moving each to the back in that order is
-- what serving the head one at a time does, so the moves are written together before the
-- ring is read again. The lease tokens come from one block of the sequence reserved per
-- claim. Bounded: a turn that keeps its lane in the ring takes (or drops) jobs and counts
-- against guard; a turn that parks or empties a lane removes it from the ring. Returns how
-- many jobs were leased
local function serve_ring(want, now, lease, dead_ttl, qt, out, zargs, h)
  local taken_total = 0
  local guard = 2 * want + 100
  local back = {}
  while taken_total < want and guard > 0 do
    local heads = call('ZRANGE', K_RING, 0, want - taken_total - 1)
    if #heads == 0 then break end
    -- as many lanes as jobs wanted: the ring may hold more (see end_turn)
    local busy = #heads > 1 and #heads == want - taken_total
    if not h.seq and not h.direct then h.seq = call('INCRBY', K_SEQ, want) - want end
    -- the running counts of the groups due, in one read (and once: whether groups' own
    -- settings exist, else no group's are read); nothing of it while only the default lane
    -- is served
    local active = {}
    local groups = {}
    for _, g in ipairs(heads) do if g ~= '' then groups[#groups + 1] = g end end
    if #groups > 0 then
      if qt.gconf == nil then qt.gconf = call('EXISTS', K_GCONF) == 1 end
      local n = call('HMGET', K_GACTIVE, unpack(groups))
      for i, g in ipairs(groups) do active[g] = n[i] end
    end
    -- each lane's turn: {lane, how many ids it gave, drained, blocked, wait_until, lim}
    local turns, all = {}, {}
    -- a lane alone in the ring gives all it can at once
    local alone = #heads == 1
    for i, g in ipairs(heads) do
      local room = 1
      if alone then room = want - taken_total end
      local blocked, wait_until, lim = false, nil, nil
      if g ~= '' then room, blocked, wait_until, lim = group_terms(g, room, now, qt, active[g]) end
      local got, drained = nil, false
      if not blocked then
        got, drained = take(g, room)
        -- fewer than room taken off a group's lane: it is empty
        if g ~= '' and #got < room then drained = true end
        for _, id in ipairs(got) do all[#all + 1] = id end
      end
      turns[i] = {g, got and #got or 0, drained, blocked, wait_until, lim}
    end
    local leased = {}
    taken_total = taken_total + lease_jobs(all, now, lease, dead_ttl, out, zargs, h, leased)
    -- what each turn leased, charged to its group's running count (one write for all)
    local at, charged, delta, cur = 0, {}, {}, {}
    for _, t in ipairs(turns) do
      local taken = 0
      for k = at + 1, at + t[2] do if leased[k] then taken = taken + 1 end end
      at = at + t[2]
      t[7] = taken
      if taken > 0 and t[1] ~= '' then
        charged[#charged + 1] = t[1]
        delta[t[1]] = taken
        cur[#cur + 1] = active[t[1]]
      end
    end
    local counts = {}
    if #charged > 0 then
      for i, n in ipairs(add_counts(charged, delta, cur)) do counts[charged[i]] = n end
    end
    for _, t in ipairs(turns) do
      if end_turn(t[1], t[7], t[3], t[4], t[5], t[6], now, back, counts[t[1]], busy) then
        guard = guard - 1
      end
    end
    requeue_turns(back)
  end
  return taken_total
end

-- the holder of the leases a claim makes: worker wid ('' a pull-API consumer) and the claim's
-- nonce; a registered worker's leases also get ordinals (ln, its last one) and are recorded in
-- its set of held jobs (ids); save_holder writes those back. alone: a hand-off to the only
-- parked worker (see do_claim's wake token)
local function holder(wid, nonce, alone)
  local h = {wid = wid, nonce = nonce, ids = {}, alone = alone, k = 0}
  if wid ~= '' then
    local wk = worker_key(wid)
    local ln = call('HGET', wk, 'ln')
    h.ln = ln and count_of(ln)
    if ln and not h.ln then
      -- garbage: the ordinals restart at what the worker reported started
      field_aside(wk, 'ln', 'out of range')
      h.ln = count_of(call('HGET', wk, 'sn')) or 0
    end
  end
  return h
end

local function save_holder(h)
  if #h.ids == 0 then return end
  call('HSET', worker_key(h.wid), 'ln', h.ln)
  call('SADD', held_key(h.wid), unpack(h.ids))
end

-- lease up to want runnable jobs to holder h (see claim.lua for the order and the reply);
-- also returns whether runnable jobs remain. handing: a claim made by enqueue for a parked
-- worker, which skips the maintenance (the worker's own claims and reap do it) and the next
-- wake-up time (nobody reads it). given: new plain jobs (ids in order, on no lane yet) that
-- are all there is to run (see HO.direct): the first ones are leased, not the ring's lanes,
-- and the third value is how many of them were taken (leased, or set aside by lease_jobs);
-- none while jobs wait aside on limits, which go first
local function do_claim(want, lease, dead_ttl, now, handing, h, given)
  -- Lua's unpack() takes a few thousand values at most: callers ask for at most
  -- MAX_JOBS_PER_CALL
  want = math.min(want, MAX_JOBS_PER_CALL)
  local asked = want
  if not handing then
    bury_dead(now, dead_ttl, 1)
    recover(now, 100, dead_ttl)
    promote(now, math.max(want, 100), false)
  end
  -- tokens from the worker's material when it has enough for every lease this may make
  h.direct = #h.nonce >= 16 * want
  local qt
  want, qt = queue_terms(want, now)
  local out = {now, -1}
  local took = 0
  if given and (qt.lw or want == 0) then return out, nil, took end
  if qt.lw then LIM.release_held(now) end  -- jobs wait aside on limits (lib/limiters)
  local zargs = {}
  local taken
  if given then
    took = math.min(want, #given)
    taken = lease_jobs({unpack(given, 1, took)}, now, lease, dead_ttl, out, zargs, h)
  else
    taken = serve_ring(want, now, lease, dead_ttl, qt, out, zargs, h)
  end
  save_holder(h)
  if #zargs > 0 then
    -- a lease that runs out before every other one: an idle consumer must re-arm its wake-up
    -- for it (it blocked knowing only the earlier deadlines), so leave it a token; not when
    -- handing to the only parked worker (h.alone, see hand_off): its own next claim tells it
    local first = not h.alone and call('ZRANGE', K_ACTIVE, 0, 0, 'WITHSCORES')
    call('ZADD', K_ACTIVE, unpack(zargs))
    if first and (not first[2] or now + lease < tonumber(first[2])) then wake() end
  end
  if qt.rate_key and taken > 0 then
    call('INCRBY', qt.rate_key, taken)
    call('PEXPIRE', qt.rate_key, 2 * qt.rate_ms)
  end
  -- runnable jobs left for other consumers; not while paused or out of rate, or every
  -- consumer's blocking wait would return at once and spin
  local more = has_ready()
  if more and not qt.paused and qt.rate_wake < 0 then wake() end
  if taken < asked and not handing then
    local nw = next_wake(qt.lw)
    if qt.rate_wake >= 0 and (nw < 0 or qt.rate_wake < nw) then nw = qt.rate_wake end
    out[2] = nw
  end
  return out, more, took
end

-- claim for a worker (wid '' = a pull-API consumer, which never parks). nonce: random, for
-- the tokens. started, free: a registered worker's report ('' none): it has started (or given
-- up) its first `started` leases, and starts the next `free` jobs it gets at once (after those
-- of the claims it sent before this one and has no reply to yet: a busy worker keeps two in
-- flight, see fetch.py)
local function claim_for(wid, want, lease, dead_ttl, park_ms, now, nonce, started, free)
  local handed = {}
  local n = 0
  if wid ~= '' then n = unpark(wid, handed) end
  local h = holder(wid, nonce)
  local before = h.ln  -- the leases it was given before this claim's
  local out = do_claim(math.max(want - n, 0), lease, dead_ttl, now, false, h)
  local taken = (#out - 2) / CLAIMED_JOB_VALUES  -- after now and the next wake-up
  if n > 0 then
    -- what was handed over was leased first: it comes first, so the worker starts its jobs
    -- in the order of their ordinals
    local all = {out[1], out[2]}
    for _, v in ipairs(handed) do all[#all + 1] = v end
    for i = 3, #out do all[#all + 1] = out[i] end
    out = all
  end
  started = num(started, nil)
  if wid ~= '' and started then
    local wk = worker_key(wid)
    local sn = count_of(call('HGET', wk, 'sn') or '')
    if sn then
      -- a claim sent while another was in flight: the worker has not seen that one's leases
      -- yet, but when they all start at once (sn, the server's count, covers them) this
      -- claim's come right after them
      local base = started
      if before and before > started and sn >= before then base = before end
      local upto = base + math.min(num(free, 0), n + taken)
      if upto > sn then call('HSET', wk, 'sn', upto) end
    end
  end
  if wid ~= '' and park_ms > 0 and n + taken < want then
    -- with the material its claim left unused: a hand-off's tokens are new ones
    if h.direct then nonce = string.sub(nonce, 16 * h.k + 1) end
    park(wid, now + park_ms, want - n - taken, lease, dead_ttl, nonce)
  end
  return out
end
