--[[ batches: fan-out / fan-in bookkeeping; counting sub-jobs in (batch_add) and their
  outcomes (batch_outcome, batch_apply), and firing the batch once all are in
  (batch_maybe_finish: its callback runs, or is cancelled).
  Needs: core, events (emit_job), lanes (push_ready and cancel_waiting, for the callback job).

  A batch lives on its home queue (the queue of its callback):
  base.."batch:"..bid        HASH  s state (open|completed|failed|cancelled), total, done, failed,
                                   n (ids handed out), sealed, policy (continue|fail|ignore),
                                   cb (callback job id), grp / pri (sub-jobs' group and
                                   priority), lim (set: grp's limit is the batch's own), ttl, w
  base.."batch:"..bid..":all"  ZSET  sub-job members (the id for one on the home queue, else
                                     its own queue's key base followed by the id),
                                     scored by the order they were added
  base.."batch:"..bid..":seen" SET   members whose outcome was counted (exactly once)
  base.."batch:"..bid..":res"  HASH  member -> result      base..":err" HASH member -> error
  A chain is a row of batches of one sub-job each: step k is the callback of link k-1 and
  the sub-job of link k, so its outcome fires the next link (or fails it, down the chain).
  A sub-job's hash has b (batch id) and, when its batch lives on another queue, bh (that
  queue's name) and bm (its member name there); its outcome then goes through base.."outbox"
  (a LIST on its own queue) and is applied to the batch by batch.lua 'apply', so every script
  still touches one slot. ]]

-- the error recorded for a sub-job cancelled before it started
local CANCELLED_ERROR = cjson.encode({type = 'Cancelled', message = 'cancelled'})

-- batch_maybe_finish tells the next link of a chain that its step was cancelled, through
-- batch_outcome, defined below
local batch_outcome
-- a finished job tells its dependents (lib/deps, which comes later and defines it)
local deps_outcome

-- what a dependent keeps of a completed dependency of task task whose result is res (as
-- stored): '<task>\0<result>' (the task names the return annotation to read it by, once the
-- dependency's record is gone); nil without a result
local function dep_kept(task, res)
  if not res then return nil end
  return (task or '') .. '\0' .. res
end

-- count a sub-job into its batch (idempotent on the member); returns 1 if it was new
local function batch_add(bid, member)
  local bk = batch_key(bid)
  if call('ZSCORE', bk .. ':all', member) then return 0 end
  call('ZADD', bk .. ':all', call('HINCRBY', bk, 'n', 1), member)
  call('HINCRBY', bk, 'total', 1)
  return 1
end

-- a batch that ended keeps its record and collected results for its retention (ms; 0 forever)
local function expire_batch(bk, ttl)
  if ttl > 0 then
    call('PEXPIRE', bk, ttl)
    for _, s in ipairs({':all', ':seen', ':res', ':err'}) do call('PEXPIRE', bk .. s, ttl) end
  end
end

-- why a callback is cancelled when its batch failed: the one error of a chain's step (a batch
-- of one), or how many sub-jobs failed
local function upstream(bk, bid, failed, total)
  if total == 1 then
    local ok, e = pcall(cjson.decode, call('HVALS', bk .. ':err')[1] or '')
    if ok and type(e) == 'table' and type(e.type) == 'string' then
      return cjson.encode({type = 'Cancelled', message = 'the step before it failed: '
        .. e.type .. ': ' .. tostring(e.message or '')})
    end
  end
  return cjson.encode({type = 'Cancelled', message = 'its batch ' .. bid .. ' failed ('
    .. failed .. ' of ' .. total .. ' sub-jobs)'})
end

-- fire the batch once every sub-job has an outcome and no more can be added
local function batch_maybe_finish(bid, now)
  local bk = batch_key(bid)
  local b = call('HMGET', bk, 's', 'total', 'done', 'failed', 'sealed', 'policy', 'cb', 'grp',
    'ttl', 'lim')
  if b[1] ~= 'open' or b[5] ~= '1' then return end
  local total, done, failed = count_of(b[2]) or 0, count_of(b[3]) or 0, count_of(b[4]) or 0
  if done + failed < total then return end
  local state = 'completed'
  if failed > 0 and b[6] == 'fail' then state = 'failed' end
  call('HSET', bk, 's', state, 'f', now)
  if b[7] then
    local ck = job_key(b[7])
    if call('HGET', ck, 's') == 'waiting' then
      if state == 'completed' then
        call('HSET', ck, 's', 'queued')
        BL.count(call('HGET', ck, 't'), 1)
        push_ready(b[7], call('HGET', ck, 'pr'), false, call('HGET', ck, 'g'))
        wake()
      elseif cancel_waiting(b[7], ck, now, count_of(b[9]) or 0,
          upstream(bk, bid, failed, total)) then
        -- a callback that is itself a sub-job (a chain's step) fails its own batch in turn
        batch_outcome(b[7], ck, false, CANCELLED_ERROR, now)
      end
    end
  end
  if b[10] then call('HDEL', K_GCONF, 'limit:' .. b[8]) end
  expire_batch(bk, count_of(b[9]) or 0)
  announce(bk, 'batch:' .. bid)
end

-- record a sub-job's outcome in its batch (on this queue); exactly once per member
local function batch_apply(bid, member, ok, value, now)
  local bk = batch_key(bid)
  local state = call('HGET', bk, 's')
  -- a batch that is gone or finished takes no more outcomes; a cancelled one still counts
  -- the sub-jobs that were running, and keeps its expiry
  if state ~= 'open' and state ~= 'cancelled' then return end
  if call('SADD', bk .. ':seen', member) == 0 then return end
  if ok then
    call('HINCRBY', bk, 'done', 1)
    call('HSET', bk .. ':res', member, value)
  else
    call('HINCRBY', bk, 'failed', 1)
    call('HSET', bk .. ':err', member, value)
  end
  if state == 'cancelled' then
    expire_batch(bk, count_of(call('HGET', bk, 'ttl')) or 0)
  else
    batch_maybe_finish(bid, now)
  end
end

-- a job finished for good (completed, dead-lettered or cancelled): tell its batch, if any,
-- and its dependents (dd, lib/deps); returns true when something was handed over through the
-- outbox (see batch.lua 'apply', deps.lua 'met')
batch_outcome = function(id, jk, ok, value, now)
  local r = call('HMGET', jk, 'b', 'bh', 'bm', 'dd')
  local kept = nil
  if r[4] and ok then kept = dep_kept(call('HGET', jk, 't'), value) end
  local forwarded = r[4] and deps_outcome(id, ok, now, kept, r[4]) or false
  if not r[1] then return forwarded end
  if not r[2] then
    batch_apply(r[1], id, ok, value, now)
    return forwarded
  end
  -- the batch lives on another queue (another cluster slot): hand the outcome over, as
  -- length-prefixed fields (binary-safe: results may be pickles)
  local rec = {}
  -- (a garbled record without its member name there is named by its id)
  for _, f in ipairs({r[1], r[2], r[3] or id, ok and '1' or '0', value}) do
    rec[#rec + 1] = #f .. ':' .. f
  end
  call('RPUSH', BASE .. 'outbox', table.concat(rec))
  return true
end

-- record job id cancelled for the reason err (JSON), kept dead_ttl ms (0: for good): listed in
-- the cancelled index, announced to its waiters, counted into its batch (fail, expiry, a
-- cancel met while its holder was lost). The caller counts it in stats
local function to_cancelled(id, jk, err, now, dead_ttl)
  call('HSET', jk, 's', 'cancelled', 'e', err, 'f', now)
  if dead_ttl > 0 then
    call('PEXPIRE', jk, dead_ttl)
    follow_record(id, call('HGET', jk, 'xk'), dead_ttl)
  end
  index_finished(K_CANCELLED, now, {id})
  emit_job('cancelled', id, jk, err)
  announce(jk, id)
  batch_outcome(id, jk, false, err, now)
end
