--[[ deps: job dependencies (see lib/deps for the keys). Runs on one queue:
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] operation, then by operation (Returns: below, per operation):
    add    ARGV[3] id   ARGV[4] task   ARGV[5] payload   ARGV[6] max attempts   ARGV[7]
           priority   ARGV[8] group ('' none)   ARGV[9] options JSON ('' none)   ARGV[10]
           policy (cancel|run|fail)   ARGV[11] retention ms of a cancelled or dead end (0 for
           good)   ARGV[12..] its dependencies (members, at most MAX_JOBS_PER_CALL)
           stores the job waiting for them; returns 1 stored, 0 a job with this id exists
           (nothing changed), or {-3, member}: that dependency on this queue is no job
           (nothing stored)
    adds   ARGV[3] policy   ARGV[4] retention ms (as for add: every step of the call has
           them)   ARGV[5] t, then t templates of 5 values (task, max attempts, priority,
           group, options), then steps of a workflow, 6 values each then their
           dependencies: id, payload, its template's number (1..t), its lone dependent on
           this queue (a member, counted now: '' none), mask ('1' at the place of each
           dependency stored with this step as its lone dependent, '' none), k, then k
           dependencies (members); stores each as add does (a step's dependencies are
           stored before it: earlier in this call or before it); at most MAX_JOBS_PER_CALL
           steps and dependencies together; returns the number of steps stored
    park   ARGV[3] id   ARGV[4] lease token   ARGV[5] policy   ARGV[6] retention ms
           ARGV[7..] dependencies: the active job, fenced by its lease, leaves its lease
           without spending the attempt and waits for them (its children); returns 1, -1 no
           such job, -2 token mismatch or not active, {-3, member} as for add
    check  ARGV[3..] ids on this queue: returns the first that is no job, or false
    watch  ARGV[3] a dependent (member)   ARGV[4..] ids of its dependencies on this queue:
           registers it with each; returns a code per id: 'c' completed, 'f' failed or
           cancelled, 'x' no such job, 'w' registered
    met    ARGV[3..] quadruples: dependent id (on this queue), dependency (member), 1
           completed / 0 failed, its result as stored ('' none: kept for the dependent):
           each counted once; returns the number of quadruples
    extend ARGV[3] id   ARGV[4] mask (as for adds)   ARGV[5..] more dependencies for a
           waiting dependent (a workflow's node with more than one call holds); returns 1, 0
           when it is not waiting
    gate   ARGV[3] workflow id   ARGV[4] its name   ARGV[5] its graph (JSON): stores the
           workflow's record, waiting (closed); returns 1, 0 when it exists
    open   ARGV[3] workflow id   ARGV[4] retention ms (0: for good): completes the record,
           which releases the nodes that wait for it; returns 1, 0 when it was not closed
    more   ARGV[3..] triples: id on this queue, 1 / 0, its result as stored ('' none): tell
           more of its dependents (the rest of a dependency's dependents, handed on through
           the outbox); returns 1 when some are left for another call
    kept   ARGV[3] id   ARGV[4..] members (at most MAX_JOBS_PER_CALL): the results of
           those dependencies kept for job id (nil where none); read only ]]
local op = ARGV[2]
local now = now_ms()

local function tail(from)
  local out = {}
  for i = from, #ARGV do out[#out + 1] = ARGV[i] end
  check_count(#out)
  return out
end

-- a step's values shared with others (a template: task, max attempts, priority, group,
-- options, then policy and retention ms, as written in the record)
local function shared(task, m, pr, g, o, policy, ttl)
  return {task, m, pr, g, o, policy, string.format('%d', tonumber(ttl) or 0)}
end

-- store job id (its payload, and tp: shared's values) waiting for deps; dd: its lone
-- dependent, counted now (a member, '' or nil none: lib/deps DQ.dependents_add), and mask
-- which of deps count it already (lib/deps dep_wait). made: when the caller found that none
-- of its ids named a record, the ids stored since (a record of one of them exists only if it
-- is one of those; nil: each is looked up); jk: its record's key, when the caller made it;
-- stamp: the time as written in records (string.format('%d', now): one per call, not a
-- number written as text once per step)
local function store(id, payload, tp, deps, dd, mask, made, jk, stamp)
  jk = jk or job_key(id)
  if made then
    if made[id] then return 0 end
    made[id] = true
  elseif call('EXISTS', jk) == 1 then
    return 0
  end
  local f = REC.new(tp[1], payload, tp[2], stamp or now)
  if tp[3] ~= '0' then f[#f + 1], f[#f + 2] = 'pr', tp[3] end
  if tp[4] ~= '' then f[#f + 1], f[#f + 2] = 'g', tp[4] end
  if tp[5] ~= '' then f[#f + 1], f[#f + 2] = 'o', tp[5] end
  if dd and dd ~= '' then f[#f + 1], f[#f + 2] = 'dd', dd end
  emit_add('enqueued', id, tp[1], 0, nil, nil)
  local policy, ttl = tp[6], tp[7]
  if #deps == 1 and DQ.wait_lone(id, jk, deps[1], policy, ttl, stamp or now, f, mask == '1') then
    return 1
  end
  dep_wait(id, jk, deps, policy, ttl, now, false, f, mask)
  return 1
end

-- a count from ARGV[i] that sizes the call (a natural number), or an error before any write
local function size_at(i)
  local k = tonumber(ARGV[i])
  if not k or k < 0 or k % 1 ~= 0 then
    error('aioqueue: deps ' .. op .. ': not a count at argument ' .. i, 0)
  end
  return k
end

if op == 'add' then
  local id = ARGV[3]
  local jk = job_key(id)
  local deps = tail(12)
  if call('EXISTS', jk) == 1 then return 0 end
  local missing = dep_missing(deps)
  if missing then return {-3, missing} end
  store(id, ARGV[5], shared(ARGV[4], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11]),
    deps, nil, nil, nil, jk)
  call('HINCRBY', K_STATS, 'enqueued', 1)
  emit_flush()
  return 1
end

if op == 'adds' then
  -- the templates; the steps and their dependencies, counted before any write; and one look
  -- for all of their records (a workflow's own ids name none: no look a step)
  local nt = size_at(5)
  check_count(nt)
  local tps, at = {}, 6
  for i = 1, nt do
    tps[i] = shared(ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], ARGV[at + 4], ARGV[3],
      ARGV[4])
    at = at + 5
  end
  -- each step: where its values start, its template, its number of dependencies, its key
  local steps, tpl, ks, keys, work, last = {}, {}, {}, {}, 0, #ARGV
  while at <= last do
    local k, tp = size_at(at + 5), tps[tonumber(ARGV[at + 2])]
    if not tp then error('aioqueue: deps adds: no template ' .. tostring(ARGV[at + 2]), 0) end
    local i = #steps + 1
    steps[i], tpl[i], ks[i], keys[i] = at, tp, k, job_key(ARGV[at])
    work = work + 1 + k
    check_count(work)
    at = at + 6 + k
  end
  local made = nil
  if #keys > 0 and call('EXISTS', unpack(keys)) == 0 then made = {} end
  local n, stamp = 0, string.format('%d', now)
  DQ.begin()
  for s, a in ipairs(steps) do
    local deps = {}
    for i = a + 6, a + 5 + ks[s] do deps[#deps + 1] = ARGV[i] end
    n = n + store(ARGV[a], ARGV[a + 1], tpl[s], deps, ARGV[a + 3], ARGV[a + 4], made, keys[s],
      stamp)
  end
  DQ.flush(true)
  if n > 0 then call('HINCRBY', K_STATS, 'enqueued', n) end
  emit_flush()
  return n
end

if op == 'park' then
  local id, tok = ARGV[3], ARGV[4]
  local jk = job_key(id)
  local deps = tail(7)
  local r = call('HMGET', jk, 's', 'l', 'a', 'g', 'wk', 'o', 'xk', 'd1', 'dr')
  if not r[1] then return -1 end
  if r[1] ~= 'active' or r[2] ~= tok then return -2 end
  local missing = dep_missing(deps)
  if missing then return {-3, missing} end
  if r[8] then
    -- it waited for a lone dependency (lib/deps d1): its result joins the others kept for it
    -- (a job with d1 has no set and no hash: what is there is an earlier job's, dropped)
    local rk = select(3, extras_of(id))
    call('DEL', deps_key(id), rk)
    if r[9] then call('HSET', rk, r[8], r[9]) end
    call('HDEL', jk, 'd1', 'dr')
  end
  call('ZREM', K_ACTIVE, id)
  unhold(r[5], id)
  release_slot(r[4])
  if r[6] then LIM.limits_done(r[6], jk) end
  -- the attempt is not spent: a park is not a failure
  local a = count_of(r[3]) or 1
  -- (and its children's results, kept for it, follow its record: xk, lib/core)
  call('HSET', jk, 'a', math.max(a - 1, 0), 'rl', tok, 'xk', r[7] or 'r')
  dep_wait(id, jk, deps, ARGV[5], tonumber(ARGV[6]) or 0, now)
  if has_ready() then wake() end
  return 1
end

if op == 'extend' then
  local id = ARGV[3]
  local jk = job_key(id)
  local deps = tail(5)
  local r = call('HMGET', jk, 's', 'dp', 'dt', 'd1')
  if r[1] ~= 'waiting' or not DQ.depends(jk, r[2], r[4]) then return 0 end
  local missing = dep_missing(deps, ARGV[4])
  if missing then return {-3, missing} end
  if r[4] then
    -- a lone dependency (lib/deps d1, not met: the job waits) joins the set with these (a
    -- job with d1 has no set, no hash and no list dl: what is there is an earlier job's)
    call('DEL', deps_key(id), select(3, extras_of(id)))
    call('SADD', deps_key(id), r[4])
    call('HDEL', jk, 'd1')
    call('HSET', jk, 'dl', cjson.encode({r[4]}))
  end
  dep_wait(id, jk, deps, r[2] or 'cancel', DQ.retention(r[3]), now, true, nil, ARGV[4])
  return 1
end

if op == 'gate' then
  local jk = job_key(ARGV[3])
  if call('EXISTS', jk) == 1 then return 0 end
  call('HSET', jk, 's', 'waiting', 't', '', 'wn', ARGV[4], 'wg', ARGV[5], 'ct', now)
  return 1
end

if op == 'open' then
  local id = ARGV[3]
  local jk = job_key(id)
  if call('HGET', jk, 's') ~= 'waiting' or call('HEXISTS', jk, 'wg') == 0 then return 0 end
  call('HSET', jk, 's', 'completed', 'f', now)
  local ttl = tonumber(ARGV[4]) or 0
  if ttl > 0 then call('PEXPIRE', jk, ttl) end
  deps_outcome(id, true, now)
  emit_flush()
  return 1
end

if op == 'check' then
  local missing = dep_missing(tail(3))
  if missing then return string.sub(missing, #BASE + 1) end
  return false
end

if op == 'watch' then
  local member = ARGV[3]
  local out = {}
  for _, id in ipairs(tail(4)) do out[#out + 1] = dep_register(id, member) end
  return out
end

if op == 'met' then
  local n = (#ARGV - 2) / 4
  check_count(n)
  for i = 3, #ARGV - 3, 4 do
    dep_met(ARGV[i], ARGV[i + 1], ARGV[i + 2] == '1', now, ARGV[i + 3])
  end
  emit_flush()
  return n
end

if op == 'more' then
  check_count((#ARGV - 2) / 3)
  local left = 0
  for i = 3, #ARGV - 2, 3 do
    if deps_outcome(ARGV[i], ARGV[i + 1] == '1', now, ARGV[i + 2], '1') then left = 1 end
  end
  emit_flush()
  return left
end
if op == 'kept' then
  local members = tail(4)
  if #members == 0 then return {} end
  local _, _, rk = extras_of(ARGV[3])
  local got = redis.pcall('HMGET', rk, unpack(members))
  -- garbage in the hash (another type): set aside, and read as nothing kept (I9)
  if type(got) ~= 'table' or got.err then
    set_aside(rk, 'wrong type: ' .. call('TYPE', rk).ok)
    got = {}
    for i = 1, #members do got[i] = false end
  end
  -- a lone dependency's result is kept in the record (lib/deps d1, dr), and read from there
  -- first (a hash beside a job with d1 can only be an earlier job's: lib/deps dep_wait)
  local lone = call('HMGET', job_key(ARGV[3]), 'd1', 'dr')
  if lone[1] and lone[2] then
    for i, m in ipairs(members) do
      if m == lone[1] then got[i] = lone[2] end
    end
  end
  return got
end
return redis.error_reply('unknown operation ' .. tostring(op))
