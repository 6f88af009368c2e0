--[[ deps: job dependencies (docs/workflows.md). A job that depends on others waits in the
  state 'waiting' until each of them has an outcome, then becomes runnable (or, when one
  failed or was cancelled, follows its policy). Members name a job on any queue: its queue's
  key base followed by its id ("<prefix>:{<queue>}:<id>").
  base.."deps:"..id        SET   the dependencies job id still waits for (members)
  base.."dependents:"..id  SET   the jobs waiting for job id (members)
  base.."waiting"          ZSET  jobs waiting for dependencies, by when they started to wait
  A workflow (a DAG, _app/workflow.py) is gated: its record, job:<workflow id> (t '', wn its
  name, wg its graph as JSON), waits until every node is stored; the nodes without
  dependencies depend on it, and deps.lua 'open' completes it, which releases them.
  The dependent's record: dn dependencies left, dp policy (cancel|run|fail), dl its
  dependencies (JSON array of members), dt retention ms of a cancelled or dead end (0 for
  good). The dependency's record: dd (set once it has dependents; read by batch_outcome).
  Bounded work (I13): one script call tells at most DEPS_BUDGET dependents; the rest of a
  dependency's dependents are handed on through the outbox (a continuation entry, "\0c"),
  and so is a dependent on another queue ("\0d"); the forwarder (_leases.forward_outbox)
  applies them with deps.lua 'more' and 'met'.
  Needs: core, lanes (push_ready, cancel_waiting), batches (batch_outcome, and deps_outcome,
  declared there and defined here), deadletter (to_dead). ]]

local DEPS_BUDGET = 1000
local deps_budget = DEPS_BUDGET -- per call
local K_WAITING = BASE .. 'waiting'

local function deps_key(id) return BASE .. 'deps:' .. id end
local function dependents_key(id) return BASE .. 'dependents:' .. id end

-- an outbox entry of length-prefixed fields (binary-safe, as batch outcomes go)
local function to_outbox(fields)
  local rec = {}
  for _, f in ipairs(fields) do rec[#rec + 1] = #f .. ':' .. f end
  call('RPUSH', BASE .. 'outbox', table.concat(rec))
end

-- a member names a job of this queue: its id, else nil
local function own_id(member)
  if string.sub(member, 1, #BASE) == BASE then return string.sub(member, #BASE + 1) end
  return nil
end

-- job id (record jk, its fields r = s, dp, pr, g, dt) has no dependency left: runnable now
local function dep_release(id, jk, r)
  call('DEL', deps_key(id))
  call('ZREM', K_WAITING, id)
  call('HSET', jk, 's', 'queued', 'dn', 0)
  BL.count(call('HGET', jk, 't'), 1)
  push_ready(id, r[3], false, r[4])
  wake()
end

-- the dependency dep (a member) of job id, waiting on this queue, has its outcome (ok: it
-- completed); counted once per dependency (SREM). A failure cancels the job (policy cancel,
-- the default: DependencyFailed, and down its own dependents), dead-letters it (fail), or
-- counts as done (run)
local function dep_met(id, dep, ok, now)
  local wk = deps_key(id)
  local jk = job_key(id)
  local kind = call('TYPE', wk).ok
  if kind ~= 'set' then
    -- a set of the wrong type, or gone while its job waits: what the job waits for is
    -- lost; it is set aside and the job dead-lettered with the reason (I9), never run early
    if kind ~= 'none' then set_aside(wk, 'wrong type: ' .. kind) end
    local r = call('HMGET', jk, 's', 'dp', 'dt')
    if r[1] == 'waiting' and r[2] then
      call('ZREM', K_WAITING, id)
      to_dead(id, jk, now, cjson.encode({type = 'Garbled',
        message = 'the set of dependencies it waited for was garbled'}), count_of(r[3]) or 0)
      call('HINCRBY', K_STATS, 'failed', 1)
    end
    return
  end
  if call('SREM', wk, dep) == 0 then return end
  local r = call('HMGET', jk, 's', 'dp', 'pr', 'g', 'dt')
  if r[1] ~= 'waiting' then return end
  if not ok and r[2] ~= 'run' then
    call('DEL', wk)
    call('ZREM', K_WAITING, id)
    local err = cjson.encode({type = 'DependencyFailed', message = 'its dependency '
      .. dep .. ' failed or was cancelled'})
    local ttl = count_of(r[5]) or 0
    if r[2] == 'fail' then
      to_dead(id, jk, now, err, ttl)
      call('HINCRBY', K_STATS, 'failed', 1)
    elseif cancel_waiting(id, jk, now, ttl, err) then
      call('HINCRBY', K_STATS, 'cancelled', 1)
      batch_outcome(id, jk, false, err, now)
    end
    return
  end
  local left = call('SCARD', wk)
  if left > 0 then call('HSET', jk, 'dn', left) else dep_release(id, jk, r) end
end

-- job id of this queue finished for good (ok: completed): tell its dependents, at most
-- deps_budget of them in this call; the others (and those on other queues) go through the
-- outbox. Returns true when something went to the outbox
deps_outcome = function(id, ok, now)
  local dk = dependents_key(id)
  local flag = ok and '1' or '0'
  local forwarded = false
  if deps_budget > 0 then
    local members = call('SPOP', dk, deps_budget)
    deps_budget = deps_budget - #members
    local me = BASE .. id
    for _, m in ipairs(members) do
      local own = own_id(m)
      if own then dep_met(own, me, ok, now)
      else
        to_outbox({'\0d', m, me, flag})
        forwarded = true
      end
    end
  end
  if call('EXISTS', dk) == 1 then
    to_outbox({'\0c', BASE .. id, flag})
    forwarded = true
  end
  return forwarded
end

-- count member (a job waiting on any queue) as a dependent of job id of this queue; returns
-- 'c' it completed already, 'f' it failed or was cancelled, 'x' no such job, 'w' registered
local function dep_register(id, member)
  local jk = job_key(id)
  local s = call('HGET', jk, 's')
  if not s then return 'x' end
  if s == 'completed' then return 'c' end
  if s == 'failed' or s == 'cancelled' then return 'f' end
  call('SADD', dependents_key(id), member)
  call('HSET', jk, 'dd', 1)
  return 'w'
end

-- the first member of deps (on this queue) that names no job, or nil
local function dep_missing(deps)
  for _, dep in ipairs(deps) do
    local own = own_id(dep)
    if own and call('EXISTS', job_key(own)) == 0 then return dep end
  end
  return nil
end

-- job id (record jk) waits for deps (members; those on other queues are counted here and
-- registered there by the caller, deps.lua 'watch'); policy and dt as in the record; more:
-- these are added to the dependencies it has (a graph's node with more than one call holds)
local function dep_wait(id, jk, deps, policy, ttl, now, more)
  local wk = deps_key(id)
  local me = BASE .. id
  local dl = deps
  if more then
    local ok, old = pcall(cjson.decode, call('HGET', jk, 'dl') or '')
    if ok and type(old) == 'table' then
      for _, dep in ipairs(deps) do old[#old + 1] = dep end
      dl = old
    end
  else
    call('DEL', wk)
  end
  local failed
  for _, dep in ipairs(deps) do
    local own = own_id(dep)
    local st = 'w'
    if own then st = dep_register(own, me) end
    if st == 'w' or (st ~= 'c' and not failed) then call('SADD', wk, dep) end
    if st ~= 'w' and st ~= 'c' then failed = failed or dep end
  end
  call('HSET', jk, 's', 'waiting', 'dp', policy, 'dl', cjson.encode(dl), 'dt', ttl,
    'dn', call('SCARD', wk))
  call('ZADD', K_WAITING, now, id)
  if failed then dep_met(id, failed, false, now)
  elseif call('SCARD', wk) == 0 then
    dep_release(id, jk, call('HMGET', jk, 's', 'dp', 'pr', 'g', 'dt'))
  end
end
