--[[ deps: job dependencies (docs/workflows.md). A job that depends on others waits in the
  state 'waiting' until each of them has an outcome, then becomes runnable (or, when one
  failed or was cancelled, follows its policy). Members name a job on any queue: its queue's
  key base followed by its id ("<prefix>:{<queue>}:<id>").
  base.."deps:"..id        SET   the dependencies job id still waits for (members)
  base.."dependents:"..id  SET   the jobs waiting for job id (members), once it has two or more;
                                 a lone dependent is kept in its record's dd itself
  base.."waiting"          ZSET  jobs waiting for dependencies, by when they started to wait
  base.."depres:"..id      HASH  the results of job id's completed dependencies, kept for it:
                                 member -> '<task>\0<result as stored>' (batches' dep_kept);
                                 one of the record's extras (lib/core: xk), so it lives and
                                 dies with the dependent, whatever the dependency's result_ttl
  A workflow (a DAG, _app/workflow.py) is gated: its record, job:<workflow id> (t '', wn its
  name, wg its graph as JSON), waits until every node is stored; the nodes without
  dependencies depend on it, and deps.lua 'open' completes it, which releases them.
  The dependent's record: dp policy (cancel|run|fail; absent: cancel), dl its dependencies
  (JSON array of members), dt retention ms of a cancelled or dead end (0 for good; absent:
  DEFAULT_DEAD_TTL_MS, DQ.retention), xk 'r' (its depres
  follows the record, lib/core); a new job with one dependency: d1 that member instead of
  the set deps:<id> (counted once by leaving the state 'waiting'), and dr its result once
  met, instead of depres (a fan-out's steps and a chain's: no set, no depres). The
  dependency's record: dd, set once it has dependents: the
  lone dependent (a member), or '1' with them in its set (read by do_complete and
  batch_outcome, passed to deps_outcome).
  Bounded work (I13): one script call tells at most 1,000 dependents (deps_budget); the rest of a
  dependency's dependents are handed on through the outbox (a continuation entry, "\0c"),
  and so is a dependent on another queue ("\0d"); the forwarder (_leases.forward_outbox)
  applies them with deps.lua 'more' and 'met'. Both entries carry the dependency's result,
  copied into each dependent's depres when it is told (one HSET an edge, within the budget).
  Cost (benchmarks/workflows.py): what one call stores or releases for many jobs is written
  together where it can be (DQ.begin / DQ.flush: the new dependents of each dependency
  in one SADD, the waiting index in one ZADD; a dependency's released dependents leave the
  index and their sets in one ZREM and one DEL, and wake the workers once).
  Needs: core, lanes (push_ready, cancel_waiting), batches (batch_outcome, and deps_outcome,
  declared there and defined here), deadletter (to_dead). ]]

local deps_budget = 1000 -- per call
local K_WAITING = BASE .. 'waiting'

-- the writes a call holds back to make them together, and helpers (one table: a script's
-- main function has at most 200 locals). DQS.pending: what a call stores for many waiting
-- jobs, held until DQ.flush (nil: written at once): seen, the dependencies registered with in this call
-- (their state read once); adds, their new dependents; order, the order they came; waiting,
-- the index's (score, id) pairs. DQS.released: the jobs a dependency's outcome released
-- (while deps_outcome tells its dependents: they leave the index and their sets together;
-- nil: each at once). DQS.known: what dep_missing read of the dependencies (s, dd)
local DQ = {}
-- (and its state, one call's: a function library keeps its top-level locals from call to
-- call, and a call that failed midway must not leave writes held back for the next)
local DQS = {} -- per call

local function deps_key(id) return BASE .. 'deps:' .. id end
function DQ.dependents_key(id) return BASE .. 'dependents:' .. id end

function DQ.begin()
  DQS.pending = {seen = {}, adds = {}, had = {}, order = {}, waiting = {}, members = {}}
end

-- write what DQ.begin held back (before anything reads it); stop: hold back no more
function DQ.flush(stop)
  local p = DQS.pending
  if not p then return end
  DQS.pending = nil
  if not stop then DQ.begin() end
  for _, own in ipairs(p.order) do DQ.dependents_add(own, p.had[own], p.adds[own]) end
  if #p.waiting > 0 then call('ZADD', K_WAITING, unpack(p.waiting)) end
end

-- job id of this queue, whose record's dd was had (nil: no dependents yet), gains the
-- dependents adds (members): a lone dependent is kept in dd itself (no set: the common case
-- of a chain or a fan-out's steps, one write a step and none to tell it); more go to its set
-- of dependents, and dd becomes '1'. Returns the new dd
function DQ.dependents_add(id, had, adds)
  if not had and #adds == 1 then
    call('HSET', job_key(id), 'dd', adds[1])
    return adds[1]
  end
  if had and had ~= '1' then adds[#adds + 1] = had end
  call('SADD', DQ.dependents_key(id), unpack(adds))
  if had ~= '1' then call('HSET', job_key(id), 'dd', '1') end
  return '1'
end

-- up to want members of set key, taken out of it: a scan from its start (SPOP with a count
-- picks each member at random: in a fan-out's release that was its dearest part), and SPOP for
-- what the scan did not reach (it reads at most about want slots of the set's table)
function DQ.take(key, want)
  local scan = call('SSCAN', key, 0, 'COUNT', want)
  local got = scan[2]
  for i = #got, want + 1, -1 do got[i] = nil end
  if #got > 0 then call('SREM', key, unpack(got)) end
  if #got < want and scan[1] ~= '0' then
    for _, m in ipairs(call('SPOP', key, want - #got)) do got[#got + 1] = m end
  end
  return got
end

-- an outbox entry of length-prefixed fields (binary-safe, as batch outcomes go)
function DQ.to_outbox(fields)
  local rec = {}
  for _, f in ipairs(fields) do rec[#rec + 1] = #f .. ':' .. f end
  call('RPUSH', BASE .. 'outbox', table.concat(rec))
end

-- a member names a job of this queue: its id, else nil
function DQ.own_id(member)
  -- (find, not a substring to compare: no string made for a member of another queue's)
  if string.find(member, BASE, 1, true) == 1 then return string.sub(member, #BASE + 1) end
  return nil
end

-- DQS.released while a dependency's outcome is told: the released ids, and ready (those of
-- the plain lane) with tasks and per (their tasks, and how many each: BL.note)
function DQ.releasing() return {ready = {}, tasks = {}, per = {}, sets = {}} end

-- the released jobs ids leave the waiting index and their sets of dependencies (ids: from
-- DQ.releasing, those of the plain lane are pushed to it and counted first, and only those
-- in ids.sets had a set: a lone dependency's job has none; else each id's is dropped)
function DQ.unwait(ids)
  if ids.ready and #ids.ready > 0 then
    BL.many(ids.tasks, ids.per)
    call('RPUSH', K_READY, unpack(ids.ready))
    join_ring('')
  end
  if #ids == 0 then return end
  local keys = {}
  for i, id in ipairs(ids.sets or ids) do keys[i] = deps_key(id) end
  if #keys > 0 then call('DEL', unpack(keys)) end
  call('ZREM', K_WAITING, unpack(ids))
  wake()
end

-- keep what job id, waiting on this queue, keeps of its completed dependency dep (a member):
-- res, its task and result (batches' dep_kept; nil or '': none), in its depres (lib/core
-- extras_of: it follows the record, whose xk dep_wait set when the job began to wait)
function DQ.keep(id, dep, res)
  if not res or res == '' then return end
  DQ.keep_many(id, {dep, res})
end

-- DQ.keep for many: kv, pairs of member and what job id keeps of it (each non-empty)
function DQ.keep_many(id, kv)
  local _, _, rk = extras_of(id)
  local put = redis.pcall('HSET', rk, unpack(kv))
  if type(put) ~= 'number' then
    -- garbage where the hash goes (another type): set aside with the reason (I9), then kept
    set_aside(rk, 'wrong type: ' .. call('TYPE', rk).ok)
    call('HSET', rk, unpack(kv))
  end
end

-- job id (record jk, its fields r = s, dp, pr, g, dt, t) has no dependency left: runnable
-- now (counted into the backlog); kept: the result of its lone dependency (d1), kept in its
-- record (dr) as it leaves the wait. While a dependency's outcome releases many (DQS.released),
-- those of the plain lane (no priority, no group) go to it in one RPUSH, and the backlog
-- counts once per task, in DQ.unwait
local function dep_release(id, jk, r, kept)
  if kept then call('HSET', jk, 's', 'queued', 'dr', kept) else call('HSET', jk, 's', 'queued') end
  local rel = DQS.released
  if rel and lane_prio(r[3]) == 0 and (not r[4] or r[4] == '') then
    BL.note(rel.tasks, rel.per, r[6], 1)
    rel.ready[#rel.ready + 1] = id
  else
    BL.count(r[6], 1)
    push_ready(id, r[3], false, r[4])
  end
  if not rel then return DQ.unwait({id}) end
  rel[#rel + 1] = id
  if not r[7] then rel.sets[#rel.sets + 1] = id end
end

-- a dependent whose set of dependencies is garbled (of the wrong type, or gone while it
-- waits), or whose lone dependency (d1) is no member: what it waits for is lost; the set is
-- set aside and the job dead-lettered with the reason (I9), never run early
function DQ.garbled(id, jk, wk, now, what)
  local kind = call('TYPE', wk).ok
  if kind ~= 'none' then set_aside(wk, 'wrong type: ' .. kind) end
  local r = call('HMGET', jk, 's', 'dp', 'dt', 'd1')
  if r[1] == 'waiting' and DQ.depends(jk, r[2], r[4]) then
    call('ZREM', K_WAITING, id)
    to_dead(id, jk, now, cjson.encode({type = 'Garbled', message = (what
      or 'the set of dependencies') .. ' it waited for was garbled'}), DQ.retention(r[3]))
    call('HINCRBY', K_STATS, 'failed', 1)
  end
end

-- whether m has the shape of a member ("<prefix>:{<queue>}:<id>", this queue's prefix):
-- a lone dependency (d1) without it is garbage, and its job can never be told
function DQ.member_like(m)
  local pre = string.match(BASE, '^(.*:){[^{}]*}:$')
  if not pre or string.sub(m, 1, #pre + 1) ~= pre .. '{' then return pre == nil end
  local close = string.find(m, '}:', #pre + 2, true)
  return close ~= nil and close + 2 <= #m
end

-- job id (record jk, waiting) has a lone dependency d1 that is no member (garbage): it is
-- dead-lettered as Garbled; returns true then
function DQ.lone_garbled(id, jk, d1, now)
  if DQ.member_like(d1) then return false end
  DQ.garbled(id, jk, deps_key(id), now, 'the dependency (d1)')
  return true
end

-- the dependency dep (a member) of job id, waiting on this queue, has its outcome (ok: it
-- completed; res what the job keeps of it: dep_kept); counted once per dependency. A lone
-- dependency (the record's d1, dep_wait) is counted by the state it changes, and its result
-- kept in the record (dr); others by SREM from the job's set. A failure cancels the job
-- (policy cancel, the default: DependencyFailed, and down its own dependents), dead-letters
-- it (fail), or counts as done (run)
local function dep_met(id, dep, ok, now, res)
  local jk = job_key(id)
  local r = call('HMGET', jk, 's', 'dp', 'pr', 'g', 'dt', 't', 'd1')
  local left, kept = 0, nil
  -- (its set's key: a lone dependency, r[7], has none)
  local wk = not r[7] and deps_key(id) or nil
  if r[7] then
    -- counted before (it no longer waits), or not its dependency: garbage told it, or
    -- garbage over its d1 (dead-lettered then: nothing could tell it)
    if r[1] ~= 'waiting' then return end
    if r[7] ~= dep then return DQ.lone_garbled(id, jk, r[7], now) end
    if ok and res and res ~= '' then kept = res end
  else
    local gone = redis.pcall('SREM', wk, dep)
    if type(gone) ~= 'number' then return DQ.garbled(id, jk, wk, now) end
    if gone == 0 then
      -- counted before; or its set is gone while the job still waits
      if call('EXISTS', wk) == 0 then DQ.garbled(id, jk, wk, now) end
      return
    end
    -- counted now: the set was there, so the job still waits (a released or ended job's is gone)
    if ok then DQ.keep(id, dep, res) end
    left = call('SCARD', wk)
    if ok and left > 0 then return end
    if r[1] ~= 'waiting' then return end
  end
  if not ok and r[2] ~= 'run' then
    call('DEL', wk or deps_key(id))
    call('ZREM', K_WAITING, id)
    local err = cjson.encode({type = 'DependencyFailed', message = 'its dependency '
      .. dep .. ' failed or was cancelled'})
    local ttl = DQ.retention(r[5])
    if r[2] == 'fail' then
      to_dead(id, jk, now, err, ttl)
      call('HINCRBY', K_STATS, 'failed', 1)
    elseif cancel_waiting(id, jk, now, ttl, err) then
      call('HINCRBY', K_STATS, 'cancelled', 1)
      batch_outcome(id, jk, false, err, now)
    end
    return
  end
  if left == 0 then dep_release(id, jk, r, kept) end
end

-- job id of this queue finished for good (ok: completed, and res what its dependents keep of
-- it: dep_kept; nil none): tell its dependents, at most deps_budget of them in this call; the
-- others (and those on other queues) go through the outbox, with res. dd: its record's field
-- (nil: read here), a lone dependent itself (DQ.dependents_add) or '1' (a set). Returns true
-- when something went to the outbox
deps_outcome = function(id, ok, now, res, dd)
  local flag = ok and '1' or '0'
  dd = dd or call('HGET', job_key(id), 'dd')
  -- a lone dependent is told at once (one edge: within the bound); a set, deps_budget of them
  local lone = dd and dd ~= '1' and dd ~= ''
  local tells = ok and lone and DQS.tells
  if tells then
    -- completions told together (DQ.told): a fan-in's dependent counts them at once (its id
    -- cut out of its member once a call: own, member -> id or false)
    if tells == true then
      tells = {order = {}, by = {}, own = {}}
      DQS.tells = tells
    end
    local own = tells.own[dd]
    if own == nil then
      own = DQ.own_id(dd) or false
      tells.own[dd] = own
    end
    if own then
      local l = tells.by[own]
      if not l then
        l = {}
        tells.by[own] = l
        tells.order[#tells.order + 1] = own
      end
      l[#l + 1], l[#l + 2] = BASE .. id, res or ''
      return false
    end
  end
  local dk = DQ.dependents_key(id)
  local members, more = {}, not lone
  if lone then members = {dd}
  elseif deps_budget > 0 then
    local want = deps_budget
    members = DQ.take(dk, want)
    deps_budget = deps_budget - #members
    more = #members == want
  end
  local forwarded = false
  if #members > 0 then
    local outer = DQS.released
    DQS.released = DQ.releasing()
    local me = BASE .. id
    for _, m in ipairs(members) do
      local own = DQ.own_id(m)
      if own then dep_met(own, me, ok, now, res)
      else
        DQ.to_outbox({'\0d', m, me, flag, res or ''})
        forwarded = true
      end
    end
    local mine = DQS.released
    DQS.released = outer
    DQ.unwait(mine)
  end
  if more and call('EXISTS', dk) == 1 then
    DQ.to_outbox({'\0c', BASE .. id, flag, res or ''})
    forwarded = true
  end
  return forwarded
end

-- hold back the completions that deps_outcome tells lone dependents of this queue until
-- DQ.told (a call that completes many jobs: do_complete); failures are told at once. (true
-- until the first is held back: a call whose jobs have no dependents makes no table)
function DQ.telling() DQS.tells = true end

-- job id, waiting on this queue, is told that the dependencies in pairs (member, result as
-- kept: dep_kept, '' none) completed: as dep_met for each, with one read of its record, one
-- SREM, one HSET of the results and one SCARD for all of them. (The results of all of them
-- are kept when any was still in its set: one told twice keeps the same result again, and
-- one that is none of its dependencies is never read, dependency_jobs reads its list)
local function dep_met_many(id, pairs_, now)
  if #pairs_ == 2 then return dep_met(id, pairs_[1], true, now, pairs_[2]) end
  local jk, wk = job_key(id), deps_key(id)
  local r = call('HMGET', jk, 's', 'dp', 'pr', 'g', 'dt', 't', 'd1')
  if r[7] then
    -- a lone dependency (d1): at most one of them is it; dep_met sorts them out
    for i = 1, #pairs_, 2 do dep_met(id, pairs_[i], true, now, pairs_[i + 1]) end
    return
  end
  local members, keep = {}, {}
  for i = 1, #pairs_, 2 do
    members[#members + 1] = pairs_[i]
    if pairs_[i + 1] ~= '' then keep[#keep + 1], keep[#keep + 2] = pairs_[i], pairs_[i + 1] end
  end
  local gone = redis.pcall('SREM', wk, unpack(members))
  if type(gone) ~= 'number' then return DQ.garbled(id, jk, wk, now) end
  if gone == 0 then
    -- counted before; or its set is gone while the job still waits
    if call('EXISTS', wk) == 0 then DQ.garbled(id, jk, wk, now) end
    return
  end
  if #keep > 0 then DQ.keep_many(id, keep) end
  if call('SCARD', wk) > 0 or r[1] ~= 'waiting' then return end
  dep_release(id, jk, r, nil)
end

-- tell what DQ.telling held back: each dependent once, for all its completed dependencies
function DQ.told(now)
  local tells = DQS.tells
  DQS.tells = nil
  if type(tells) ~= 'table' then return end
  local outer = DQS.released
  DQS.released = DQ.releasing()
  for _, id in ipairs(tells.order) do dep_met_many(id, tells.by[id], now) end
  local mine = DQS.released
  DQS.released = outer
  DQ.unwait(mine)
end

-- waiting jobs that a dependency on this queue ended without telling (the edge was lost:
-- garbage over the dependency's dd or its set of dependents, I9), looked for by reap: up to n
-- waiting jobs picked at random, up to k of the dependencies of each; one that ended is
-- counted now as its record says (its result kept as deps_outcome keeps it). A dependency
-- whose record is gone is left: its outcome is unknown (a completed one whose record was
-- dropped at once still tells its last dependents through the outbox). Counting twice is
-- harmless (dep_met counts a dependency once). Returns how many were counted
function DQ.sweep(now, n, k)
  local ids = redis.pcall('ZRANDMEMBER', K_WAITING, n)
  if type(ids) ~= 'table' or ids.err then return 0 end  -- garbage: left to the writers' repair
  local told = 0
  for _, id in ipairs(ids) do
    local members = redis.pcall('SRANDMEMBER', deps_key(id), k)
    if type(members) == 'table' and #members == 0 then
      -- a lone dependency (d1), or none ({false})
      local d1 = call('HGET', job_key(id), 'd1')
      members = {}
      if d1 and not DQ.lone_garbled(id, job_key(id), d1, now) then members = {d1} end
    end
    if type(members) == 'table' and not members.err then
      for _, m in ipairs(members) do
        local own = DQ.own_id(m)
        local r = own and call('HMGET', job_key(own), 's', 't', 'r')
        local s = r and r[1]
        if s == 'completed' then
          dep_met(id, m, true, now, dep_kept(r[2], r[3] or nil))
          told = told + 1
        elseif s == 'failed' or s == 'cancelled' then
          dep_met(id, m, false, now)
          told = told + 1
        end
      end
    end
  end
  return told
end

-- count member (a job waiting on any queue) as a dependent of job id of this queue; returns
-- 'c' it completed already, 'f' it failed or was cancelled, 'x' no such job, 'w' registered
local function dep_register(id, member)
  local p = DQS.pending
  if p and p.seen[id] then
    -- registered with earlier in this call (its state cannot have changed since: a call
    -- that ends a job writes what it held back first)
    local adds = p.adds[id]
    adds[#adds + 1] = member
    return 'w'
  end
  local jk = job_key(id)
  local r = DQS.known and DQS.known[id] or call('HMGET', jk, 's', 'dd')
  local s = r[1]
  if not s then return 'x' end
  if s == 'completed' then return 'c' end
  if s == 'failed' or s == 'cancelled' then return 'f' end
  if p then
    p.seen[id] = true
    p.members[BASE .. id] = id
    p.adds[id] = {member}
    p.had[id] = r[2]
    p.order[#p.order + 1] = id
  else
    -- (r may be DQS.known's: what it read stays true for the next member of this call)
    r[2] = DQ.dependents_add(id, r[2], {member})
  end
  return 'w'
end

-- the first member of deps (on this queue) that names no job, or nil (mask as dep_wait's);
-- what it read of them (s, dd) is kept for dep_wait's registrations in DQS.known (nothing
-- changes them between the two, in one call)
local function dep_missing(deps, mask)
  local known = {}
  DQS.known = nil
  for i, dep in ipairs(deps) do
    local own = DQ.own_id(dep)
    -- (one stored by this workflow's enqueue with the job as its lone dependent, a mask's
    -- '1': lib/deps dep_wait, is not looked up)
    if own and not (mask and string.byte(mask, i) == 49) then
      local jk = job_key(own)
      local r = call('HMGET', jk, 's', 'dd')
      if r[1] then known[own] = r elseif call('EXISTS', jk) == 0 then return dep end
    end
  end
  DQS.known = known
  return nil
end

-- the record's list of dependencies dl (JSON) with deps added: as text when it is a JSON
-- array (no decoding: a fan-in's list grows by 1,000 a call), else deps alone
function DQ.dl_more(old, deps)
  local add = cjson.encode(deps)
  if type(old) ~= 'string' or #old < 3 or string.sub(old, 1, 1) ~= '['
      or string.sub(old, -1) ~= ']' or string.sub(add, 1, 1) ~= '[' then
    return add
  end
  return string.sub(old, 1, -2) .. ',' .. string.sub(add, 2)
end

-- f, a waiting job's record fields to write, gains its state and its policy on a failed
-- dependency (dp, dt: retention ms of a cancelled or dead end), each only when it is not
-- the default a reader takes for it absent (cancel; DEFAULT_DEAD_TTL_MS): two fields fewer
-- in the record of a workflow's step, whose every later read scans its fields. ttl: a
-- number, or as written (text). Returns f's length
DQ.DEAD_TTL_TEXT = DEFAULT_DEAD_TTL_MS .. ''  -- (no string library while a function library loads)
function DQ.waits(f, policy, ttl)
  local n = #f
  f[n + 1], f[n + 2] = 's', 'waiting'
  n = n + 2
  if policy ~= 'cancel' then f[n + 1], f[n + 2] = 'dp', policy; n = n + 2 end
  if ttl ~= DEFAULT_DEAD_TTL_MS and ttl ~= DQ.DEAD_TTL_TEXT then
    f[n + 1], f[n + 2] = 'dt', ttl
    n = n + 2
  end
  return n
end

-- a dependent's retention of its end as its record's dt says (v as read: false when absent,
-- the default; garbage: 0, kept for good)
function DQ.retention(v)
  if not v then return DEFAULT_DEAD_TTL_MS end
  return count_of(v) or 0
end

-- whether a waiting record (jk; its dp and d1 as read) is a job that waits for dependencies
-- (not a batch's callback nor a workflow's record, which wait too): it has a policy, a lone
-- dependency or a list of them (a truthy value then)
function DQ.depends(jk, dp, d1)
  return dp or d1 or call('HEXISTS', jk, 'dl') == 1
end

-- dep_wait's common case while a call holds its writes back (DQ.begin: a workflow's steps):
-- a new job id (record jk, fields f) with one dependency dep on this queue that needs no
-- read, stored with the job as its lone dependent (masked) or registered with earlier in
-- this call. Writes what dep_wait would, without its general path; returns false (nothing
-- done) when the case does not hold
function DQ.wait_lone(id, jk, dep, policy, ttl, now, f, masked)
  local p = DQS.pending
  if not p then return false end
  if masked then
    if string.find(dep, BASE, 1, true) ~= 1 then return false end  -- (own_id's test)
  else
    -- (registered with earlier in this call, by its member: no id to cut out of it)
    local own = p.members[dep]
    if not own then return false end
    dep_register(own, BASE .. id)  -- (seen: no read)
  end
  local n = DQ.waits(f, policy, ttl)
  f[n + 1], f[n + 2] = 'd1', dep
  call('HSET', jk, unpack(f))
  local w = p.waiting
  w[#w + 1], w[#w + 2] = now, id
  return true
end

-- job id (record jk) waits for deps (members; those on other queues are counted here and
-- registered there by the caller, deps.lua 'watch'); policy and dt as in the record; more:
-- these are added to the dependencies it has (a graph's node with more than one call holds);
-- fields: more of the record's fields and values, written with these (a new job's). A new job
-- with one dependency (a step of a chain or a fan-out) keeps it in its record (d1) rather than
-- in a set (and no list dl: d1 is it), and its result there too (dr, dep_met): no set to
-- write, pop and drop. mask: '1' at the place of each dependency that counts the job among
-- its dependents already (a workflow's step stored with it as its lone dependent, dd:
-- deps.lua adds), nil none
local function dep_wait(id, jk, deps, policy, ttl, now, more, fields, mask)
  local wk = deps_key(id)
  local me = BASE .. id
  local lone = fields and not more and #deps == 1
  local dl
  if more then dl = DQ.dl_more(call('HGET', jk, 'dl'), deps)
  elseif not lone then
    -- (a new job: and no results kept for an earlier job of this id; a lone dependency
    -- uses neither: they are dropped when it joins a set, deps.lua extend and park)
    if fields then call('DEL', wk, select(3, extras_of(id))) else call('DEL', wk) end
    dl = cjson.encode(deps)
  end
  local keep, failed, kept = {}, nil, nil
  for i, dep in ipairs(deps) do
    local own = DQ.own_id(dep)
    local st = 'w'
    if own and not (mask and string.byte(mask, i) == 49) then
      st = dep_register(own, me)
      -- completed already: its result is kept for the job now (its record may expire first)
      if st == 'c' then
        local tr = call('HMGET', job_key(own), 't', 'r')
        if lone then kept = dep_kept(tr[1], tr[2] or nil)
        else DQ.keep(id, dep, dep_kept(tr[1], tr[2] or nil)) end
      end
    end
    if st == 'w' or (st ~= 'c' and not failed) then keep[#keep + 1] = dep end
    if st ~= 'w' and st ~= 'c' then failed = failed or dep end
  end
  DQS.known = nil
  local left = 0
  if lone then left = #keep
  elseif #keep > 0 then left = call('SADD', wk, unpack(keep)) end
  if more then left = call('SCARD', wk) end
  local f = fields or {}
  local n = DQ.waits(f, policy, ttl)
  -- its extras follow the record from now on (a new job: only its dependencies' results, xk
  -- 'r', unless its lone one is kept in the record; a parked job's xk was set by its caller)
  if lone then f[n + 1], f[n + 2] = 'd1', deps[1]
  else
    f[n + 1], f[n + 2] = 'dl', dl
    if fields then f[n + 3], f[n + 4] = 'xk', 'r' end
  end
  call('HSET', jk, unpack(f))
  if DQS.pending and not failed and left > 0 then
    local w = DQS.pending.waiting
    w[#w + 1], w[#w + 2] = now, id
    return
  end
  call('ZADD', K_WAITING, now, id)
  -- it ends or is released now: what the call held back is written first
  if failed or left == 0 then DQ.flush() end
  if failed then dep_met(id, failed, false, now)
  elseif left == 0 then
    dep_release(id, jk, call('HMGET', jk, 's', 'dp', 'pr', 'g', 'dt', 't'), kept)
  end
end
