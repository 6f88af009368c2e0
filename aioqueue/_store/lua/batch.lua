--[[ batch: open, extend, seal, cancel a batch (fan-out / fan-in), or apply a sub-job outcome
  handed over from another queue. Runs on the batch's home queue (see lib/batches for its keys).
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] operation   ARGV[3] batch id   then, by operation:
    open    ARGV[4] policy (continue|fail|ignore)   ARGV[5] retention ms (0: forever)
            ARGV[6] the sub-jobs' group ('' none)   ARGV[7] a concurrency limit for that group,
            which is then the batch's own and removed when it ends ('' none)
            ARGV[8] the sub-jobs' priority ('' none)   ARGV[9] seal now (1/0)
            ARGV[10..] the callback job, 9 values or none: id, task, payload, max_attempts,
            priority, group ('' none), options JSON ('' none), the batch it is itself a sub-job
            of ('' none: a chain's next link), that batch's queue when it is another one ('' =
            this queue; the caller counts the callback into that batch)
    add     ARGV[4..] members (sub-jobs on other queues, named "<their key base><id>")
    seal    (nothing)     cancel  (nothing)
    apply   ARGV[4..] outcomes handed over from other queues' outboxes, 4 values each: batch
            id, member, 1 completed / 0 failed, result or error (ARGV[3] is not used)
  Returns: open 1, or 0 when the batch exists; add the number of new members; seal 1;
  cancel the number of sub-jobs cancelled here (queued or scheduled ones); apply the number of
  outcomes; -1 when there is no such batch (add, seal, cancel) ]]
local op, bid = ARGV[2], ARGV[3]
if op == 'apply' then check_count((#ARGV - 3) / 4) elseif op == 'add' then check_count(#ARGV - 3) end
local bk = batch_key(bid)
local now = now_ms()

if op == 'open' then
  -- a hash without a state may exist already: sub-jobs counted in by an enqueue that ran
  -- first (a pipeline replayed after NOSCRIPT); keep their counts
  if call('HEXISTS', bk, 's') == 1 then return 0 end
  call('HSETNX', bk, 'total', 0)
  call('HSETNX', bk, 'n', 0)
  call('HSET', bk, 's', 'open', 'done', 0, 'failed', 0, 'policy', ARGV[4], 'ttl', ARGV[5],
    'ct', now)
  if ARGV[6] ~= '' then
    call('HSET', bk, 'grp', ARGV[6])
    if ARGV[7] ~= '' then
      call('HSET', K_GCONF, 'limit:' .. ARGV[6], ARGV[7])
      call('HSET', bk, 'lim', 1)
    end
  end
  if ARGV[8] ~= '' then call('HSET', bk, 'pri', ARGV[8]) end
  if ARGV[10] then
    local id = ARGV[10]
    local jk = job_key(id)
    local fields = REC.new(ARGV[11], ARGV[12], ARGV[13], now)
    call('HSET', jk, 's', 'waiting', 'cb', bid, unpack(fields))
    if ARGV[14] ~= '0' then call('HSET', jk, 'pr', ARGV[14]) end
    if ARGV[15] ~= '' then call('HSET', jk, 'g', ARGV[15]) end
    if ARGV[16] ~= '' then call('HSET', jk, 'o', ARGV[16]) end
    -- a chain's step is the callback of the link before it and a sub-job of the next one
    if ARGV[17] and ARGV[17] ~= '' then
      call('HSET', jk, 'b', ARGV[17])
      if ARGV[18] ~= '' then call('HSET', jk, 'bh', ARGV[18], 'bm', ARGV[1] .. id) end
    end
    call('HSET', bk, 'cb', id)
  end
  if ARGV[9] == '1' then
    call('HSET', bk, 'sealed', 1)
    batch_maybe_finish(bid, now)
  end
  return 1
end

if op == 'apply' then
  -- batch_apply ignores outcomes of batches that are gone, and counts each member once
  for i = 4, #ARGV, 4 do batch_apply(ARGV[i], ARGV[i + 1], ARGV[i + 2] == '1', ARGV[i + 3], now) end
  return (#ARGV - 3) / 4
end

if call('EXISTS', bk) == 0 then return -1 end

if op == 'add' then
  local added = 0
  for i = 4, #ARGV do added = added + batch_add(bid, ARGV[i]) end
  return added
elseif op == 'seal' then
  call('HSET', bk, 'sealed', 1)
  batch_maybe_finish(bid, now)
  return 1
elseif op == 'cancel' then
  if call('HGET', bk, 's') ~= 'open' then return 0 end
  call('HSET', bk, 's', 'cancelled', 'f', now)
  local ttl = count_of(call('HGET', bk, 'ttl')) or 0
  local n = 0
  local cb = call('HGET', bk, 'cb')
  if cb and cancel_waiting(cb, job_key(cb), now, ttl) then
    batch_outcome(cb, job_key(cb), false, CANCELLED_ERROR, now)
  end
  -- sub-jobs on this queue that have not started are cancelled here; those on other queues
  -- are cancelled by the caller on their own queues; running ones finish, uncounted
  for _, member in ipairs(call('ZRANGE', bk .. ':all', 0, -1)) do
    local mk = job_key(member)
    if cancel_waiting(member, mk, now, ttl) then
      n = n + 1
      -- its dependents, if any, end with it (its batch is cancelled: not counted there)
      local dd = call('HGET', mk, 'dd')
      if dd then deps_outcome(member, false, now, nil, dd) end
    end
  end
  if n > 0 then call('HINCRBY', K_STATS, 'cancelled', n) end
  local own = call('HMGET', bk, 'grp', 'lim')
  if own[2] then call('HDEL', K_GCONF, 'limit:' .. own[1]) end
  announce(bk, 'batch:' .. bid)
  expire_batch(bk, ttl)
  return n
end
return redis.error_reply('unknown operation ' .. tostring(op))
