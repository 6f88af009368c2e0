--[[ why: why a job is not running, from the server's state in one atomic read. Read only.
  KEYS[1..13] the shared transition keys (see lib/core; read: scheduled, active, ready, prio,
    qconf, gactive, gconf, gwait, and the registry's workers)
  ARGV[1] key base   ARGV[2] job id
  Returns a JSON object: now (server ms), s (the job's state, absent: no record) and rows, the
  reasons that hold now, the one that decides first (each row: r, its reason, and its fields):
    missing                        no record (never enqueued, or its retention ran out)
    finished    f                  completed, failed or cancelled, at f
    running     w, until, st, live leased to worker w (live: its registration is fresh) until
                                   the lease deadline, started at st
    scheduled   at                 due at (a time past: promoted by the next claim or reap)
    event       key, at            parked in ctx.wait_for_event(key) until a signal, or its
                                   timeout at
    waiting     b                  held until its batch ends (b: the batch it follows)
    dependencies n, deps           held until the jobs it depends on end: n of them left, deps
                                   up to HOLDERS of their members (key base and id)
    queue_paused                   the queue is paused
    group_paused g                 its group is paused
    group_full  g, limit, active, holders   its group runs its limit of jobs: holders, up to
                                   HOLDERS of them as [id, worker], found in the first
                                   ACTIVE_LOOK jobs of active
    group_rate  g, at              its group's rate window is used up until at
    queue_rate  at                 the queue's rate window is used up until at
    no_worker                      no live worker is registered on the queue
    limiter     name, key, at, by  its named limit name (key) does not admit it until at, by
                                   'rate' or 'conc' (its running jobs: counted without
                                   dropping stale holders, which the next claim does)
    unknown_task workers           live workers (how many) none of which declared its task
    position    ahead, lane        jobs ahead of it in its lane ('' the default lane, else its
                                   group; ahead -1: not within READY_SEARCH of the list's head)
    unreadable                     a state aioqueue does not know (garbage in the record)
  A check is a function appending its rows; CHECKS lists those of a queued job in the order a
  claim meets the blocks (a new block is one more function there and one more reason in
  _why.py). Every read is bounded by a constant (I13). ]]
local id = ARGV[2]
local now = now_ms()
local HOLDERS, ACTIVE_LOOK = 10, 1000
local f = call('HMGET', job_key(id), 's', 't', 'g', 'pr', 'due', 'wk', 'st', 'f', 'cb', 'o', 'wv', 'd1')
local job = {s = f[1], t = f[2], g = f[3] or '', pr = f[4], due = f[5], wk = f[6], st = f[7],
  f = f[8], cb = f[9], o = f[10], wv = f[11], d1 = f[12]}
local rows = {}
local function row(r) rows[#rows + 1] = r end

local function live(wid)
  local s = call('ZSCORE', K_WORKERS, wid)
  return s ~= false and s ~= nil and num(s, 0) > now
end

-- the running jobs of group g, as [id, worker], from the first ACTIVE_LOOK of active
local function holders(g)
  local out = {}
  for _, aid in ipairs(call('ZRANGE', K_ACTIVE, 0, ACTIVE_LOOK - 1)) do
    local h = call('HMGET', job_key(aid), 'g', 'wk')
    if h[1] == g then
      out[#out + 1] = {aid, h[2] or ''}
      if #out >= HOLDERS then break end
    end
  end
  return out
end

local function check_queue(q)
  if q[1] then row({r = 'queue_paused'}) end
  local rn, rms = count_of(q[2] or ''), count_of(q[3] or '')
  if rn and rms and rms > 0 then
    local window = math.floor(now / rms)
    if (count_of(call('GET', BASE .. 'qrate:' .. window)) or 0) >= rn then
      row({r = 'queue_rate', at = (window + 1) * rms})
    end
  end
end

-- the group's terms as group_terms in lib/leasing judges them
local function check_group(q)
  local g = job.g
  if g == '' then return end
  local gc = call('HMGET', K_GCONF, 'paused:' .. g, 'limit:' .. g, 'rate_n:' .. g,
    'rate_ms:' .. g)
  if gc[1] then row({r = 'group_paused', g = g}) end
  local limit = count_of(q[4] or '')
  if gc[2] then limit = count_of(gc[2]) end
  local active = count_of(call('HGET', K_GACTIVE, g)) or 0
  if limit and active >= limit then
    row({r = 'group_full', g = g, limit = limit, active = active, holders = holders(g)})
  end
  local rate_n, rate_ms = count_of(q[5] or ''), count_of(q[6] or '')
  if gc[3] then rate_n = count_of(gc[3]) end
  if gc[4] then rate_ms = count_of(gc[4]) end
  if rate_n and rate_ms and rate_ms > 0 then
    local window = math.floor(now / rate_ms)
    if (count_of(call('GET', BASE .. 'grate:' .. g .. ':' .. window)) or 0) >= rate_n then
      row({r = 'group_rate', g = g, at = (window + 1) * rate_ms})
    end
  end
end

-- who could run it: a live worker on the queue, and one that declared its task
local function check_workers()
  local n = call('ZCOUNT', K_WORKERS, '(' .. now, '+inf')
  if n == 0 then
    row({r = 'no_worker'})
    return
  end
  local entry = call('HGET', BASE .. 'tasks', job.t or '')
  if type(entry) == 'string' then
    local nl = string.find(entry, '\n', 1, true) or (#entry + 1)
    for wid in string.gmatch(string.sub(entry, 1, nl - 1), '%S+') do
      if live(wid) then return end
    end
  end
  row({r = 'unknown_task', workers = n})
end

-- its named limits (lib/limiters): the first that does not admit it now (garbage in its
-- limits: the claim dead-letters it, nothing to say here)
local function check_limits()
  local lims = LIM.job_limits(job.o, nil)
  if not lims then return end
  for _, l in ipairs(lims) do
    local at, by = LIM.closed_until(l, now, true)
    if at then
      row({r = 'limiter', name = l.name, key = l.key, at = at, by = by})
      return
    end
  end
end

-- the jobs ahead of it in its lane, in the order take() in lib/leasing serves them
local function check_position()
  local g = job.g
  if g ~= '' then
    local rank = call('ZRANK', lane_key(g), id)
    row({r = 'position', lane = g, ahead = rank or -1})
    return
  end
  local rank = call('ZRANK', K_PRIO, id)
  if rank then
    local score = num(call('ZSCORE', K_PRIO, id), 0)
    if score >= 0 then rank = rank + call('LLEN', K_READY) end  -- low priority: after the list
    row({r = 'position', lane = '', ahead = rank})
    return
  end
  local pos = call('LPOS', K_READY, id, 'MAXLEN', READY_SEARCH)
  if pos then pos = pos + call('ZCOUNT', K_PRIO, '-inf', '(0') end
  row({r = 'position', lane = '', ahead = pos or -1})
end

-- the checks of a queued job, each given the queue's settings (qconf), in the order a claim
-- meets the blocks: the queue's terms, its group's, who could run it, then its place
local CHECKS = {check_queue, check_group, check_limits, check_workers, check_position}

local function queued()
  local q = call('HMGET', K_QCONF, 'paused', 'rate_n', 'rate_ms', 'glimit', 'grate_n',
    'grate_ms')
  for _, check in ipairs(CHECKS) do check(q) end
end

local BY_STATE = {
  queued = queued,
  scheduled = function()
    local at = call('ZSCORE', K_SCHED, id) or job.due
    if job.wv then  -- a durable wait for an event (wait.lua): its timeout is the due time
      row({r = 'event', key = job.wv, at = num(at, now)})
    else
      row({r = 'scheduled', at = num(at, now)})
    end
    check_workers()
  end,
  waiting = function()
    -- its dependencies (lib/deps), read without repair: a set of the wrong type is deps.lua's
    -- to set aside (and dead-letter the job), not a reader's
    local dk = BASE .. 'deps:' .. id
    local n = redis.pcall('SCARD', dk)
    if job.d1 and not job.cb then
      -- a lone dependency, kept in the record (lib/deps)
      row({r = 'dependencies', n = 1, deps = {job.d1}})
    elseif type(n) == 'number' and n > 0 and not job.cb then
      local some = redis.pcall('SRANDMEMBER', dk, HOLDERS)
      row({r = 'dependencies', n = n, deps = type(some) == 'table' and some or {}})
    else
      row({r = 'waiting', b = job.cb or ''})
    end
  end,
  active = function()
    local wk = job.wk or ''
    row({r = 'running', w = wk, ['until'] = num(call('ZSCORE', K_ACTIVE, id), 0),
      st = num(job.st, 0), live = wk ~= '' and live(wk)})
  end,
}
local function finished() row({r = 'finished', f = num(job.f, 0)}) end
BY_STATE.completed, BY_STATE.failed, BY_STATE.cancelled = finished, finished, finished

if not job.s then
  row({r = 'missing'})
elseif BY_STATE[job.s] then
  BY_STATE[job.s]()
else
  row({r = 'unreadable'})
end
local out = {now = now, rows = rows}
if job.s then out.s = job.s end
return cjson.encode(out)
