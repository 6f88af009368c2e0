--[[ enqueue: add jobs, immediate or delayed; idempotent on the job id; a unique job takes its
  lock or names the job that holds it.
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] r, the number of runs: jobs that share everything but id and payload
  ARGV[3..] per run: 10 template values: task, max_attempts, delay_ms (-1 none), at_ms (-1 none),
  priority, group ('' none), batch id ('' none), the batch's queue when it is another one ('' =
  this queue; the caller then has counted the job into its batch there), options JSON ('' none),
  unique ('' none, else the scope letter q queued, r running or t ttl, then the lock's TTL ms);
  then k, the number of jobs in the run, and k pairs: id, payload (triples id, payload, unique
  key when the run is unique)
  Returns {now_ms, code_1, ..., code_n}, one code per job in order: 1 queued, 2 scheduled, 0 a job
  with this id exists, or (a string) the id of the job that holds its unique lock: nothing was
  stored. A job that exists is answered 0 only once it is where its state says (see in_place):
  a queued or scheduled record in no lane (garbage, or a script stopped midway before I9) is
  put back in it, so a retried enqueue never answers success for a lost job. A call whose
  caller's ACL refuses a key a job would write (its record, group lane, unique lock or batch;
  the event stream) is refused (NOPERM) before any write. Backpressure: with qconf maxq set, a
  call whose new jobs would take the queue's backlog (its exact count of queued and
  scheduled jobs, in every lane: lib/core) past maxq stores nothing and answers the error "QUEUEFULL <waiting>
  <maxq> <wait ms>" (maxq_wait: how long producers wait for room; all or nothing), counted in
  stats (refused). The lock, base.."unique:"..key, is a STRING naming its job, set with SET NX and the
  TTL; a lock of the wrong type is set aside and taken, one without a TTL is taken ]]
local now = now_ms()
-- out: the reply; plain: the new plain jobs, pushed together; new_tasks, new_counts: the
-- backlog counts to add (BL.note)
local out, plain, new_tasks, new_counts
local added = 0
local runnable = 0
local scheduled = false

-- one plain job (one run of one job, runnable now, of no group, batch, priority, options or
-- lock) into a queue without events or a backlog limit, whose id is new: the most common
-- call. Its record is written here, without the tables and functions the general way below
-- makes (each table or string a script makes costs the server about 1,400-2,400
-- instructions: docs/benchmarks.md). With no worker parked (a busy queue, or none
-- running) it is pushed and counted here too, by the same commands the shared end below
-- runs for it (the push, the ring, the counts, the wake token); with one parked, that end
-- hands it over. Anything else, or an id that exists (a retry: see in_place), takes the
-- general way. (Nothing is written before the record, as below: a refused record stores
-- nothing)
-- qconf's events and maxq, when read here; and (heads) the parked workers (HO.direct)
local qc
if #ARGV == 15 and ARGV[2] == '1' and ARGV[13] == '1' and ARGV[5] == '-1' and ARGV[6] == '-1'
  and ARGV[7] == '0' and ARGV[8] == '' and ARGV[9] == '' and ARGV[11] == '' and ARGV[12] == '' then
  qc = call('HMGET', K_QCONF, 'events', 'maxq')
  local id = ARGV[14]
  local jk = job_key(id)
  if not qc[1] and not qc[2] and call('EXISTS', jk) == 0 then
    events_on(false)
    local fields = REC.new(ARGV[3], ARGV[15], ARGV[4], now)
    fields[#fields + 1] = 's'; fields[#fields + 1] = 'queued'
    call('HSET', jk, unpack(fields))
    qc.heads = HO.heads()
    if #qc.heads == 0 then
      call('RPUSH', K_READY, id)
      join_ring('')
      call('HINCRBY', K_STATS, 'enqueued', 1)
      BL.count(ARGV[3], 1)
      wake()
      return {now, 1}
    end
    out, plain, new_tasks, new_counts = {now, 1}, {id}, {}, {}
    added, runnable = 1, 1
    BL.note(new_tasks, new_counts, ARGV[3], 1)
  end
end

if added == 0 then
  out, plain, new_tasks, new_counts = {now}, {}, {}, {}
  local pos = 3
  -- take the unique lock key for job id, or return the id of the job that holds it. A lock not
  -- written by enqueue is garbage that would hold the key for ever, and is taken: one without a
  -- TTL or with a longer one than this lock's (ttl, the task's unique_for), or (scopes
  -- 'queued' and 'running', whose lock goes with its job) one naming a job that does not exist
  local function take_lock(key, id, ttl, scope)
    if call('SET', key, id, 'NX', 'PX', ttl) then return nil end
    local holder = call('GET', key)
    local left = call('PTTL', key)
    if holder and left >= 0 and left <= tonumber(ttl)
      and (scope == 't' or call('EXISTS', job_key(holder)) == 1) then
      return holder
    end
    call('SET', key, id, 'PX', ttl)
    return nil
  end

  -- an existing job (record jk) is where its state says; a queued or scheduled one found in no
  -- lane is put back (and counted in runnable / scheduled). The plain FIFO list is searched from
  -- its tail (a retried enqueue's job is near it), within the call's search budget
  -- (ready_search, lib/lanes: I13); a job beyond it, or on a server that refuses LPOS (an ACL
  -- without it), is trusted. Returns false when no record is left (one of the wrong type, set
  -- aside)
  local function in_place(id, jk)
    local r = call('HMGET', jk, 's', 'g', 'pr', 'due')
    if not r[1] then return call('EXISTS', jk) == 1 end
    if r[1] == 'scheduled' and not call('ZSCORE', K_SCHED, id) then
      call('ZADD', K_SCHED, num(r[4], now), id)
      scheduled = true
    elseif r[1] == 'queued' then
      local pr = lane_prio(r[3])
      local there
      if r[2] then there = call('ZSCORE', lane_key(r[2]), id)
      elseif pr ~= 0 then there = call('ZSCORE', K_PRIO, id)
      elseif ready_search <= 0 then there = true -- this call's search budget is spent: trusted
      else
        local len = call('LLEN', K_READY)
        there = redis.pcall('LPOS', K_READY, id, 'RANK', -1, 'MAXLEN', ready_search)
        if type(there) == 'number' then ready_search = ready_search - (len - there)
        elseif type(there) ~= 'table' then
          -- not among the last ready_search places: missing only if they were all of them
          if len > ready_search then there = true end
          ready_search = ready_search - math.min(len, ready_search)
        elseif not string.find(there.err or '', 'WRONGTYPE', 1, true) then
          there = true
        end
      end
      if not there or type(there) == 'table' then
        push_ready(id, r[3], false, r[2])
        runnable = runnable + 1
      end
    end
    return true
  end

  -- the runs: their template values and where their jobs are in ARGV; at most
  -- MAX_JOBS_PER_CALL jobs a call (counted before any write; a run of no jobs counts as one, so
  -- the runs are bounded too)
  local runs, total = {}, 0
  for _ = 1, tonumber(ARGV[2]) do
    local run = {task = ARGV[pos], m = ARGV[pos + 1], delay = tonumber(ARGV[pos + 2]),
      at = tonumber(ARGV[pos + 3]), pr = ARGV[pos + 4], g = ARGV[pos + 5], bid = ARGV[pos + 6],
      bhome = ARGV[pos + 7], opts = ARGV[pos + 8], u = ARGV[pos + 9],
      k = tonumber(ARGV[pos + 10]) or 0, first = pos + 11, step = 2}
    total = total + math.max(run.k, 1)
    check_count(total)
    if run.u ~= '' then run.step = 3 end
    runs[#runs + 1] = run
    pos = run.first + run.k * run.step
  end

  -- Redis does not roll a script back, and the server checks the ACL of the keys a script
  -- names itself (beyond KEYS) only when it writes them: every such key a job will write (its
  -- record, its group's lane, its unique lock, its batch; the event stream when events are on)
  -- is checked first, so a refused call stores nothing (before, the jobs ahead of the refused
  -- one stayed in no lane, and a job refused at its lane kept a record in none)
  local function refused(cmd, key, ...)
    if redis.acl_check_cmd(cmd, key, ...) then return nil end
    return redis.error_reply('NOPERM this user has no permissions to run ' .. cmd .. ' on '
      .. key .. ' (an enqueue call: nothing was stored)')
  end

  -- qconf's two fields a call reads, in one read: events (lib/events) and maxq (below). (The
  -- blocks' locals end with them: a script has at most 200 locals, and enqueue is near it)
  local maxq
  do
    qc = qc or call('HMGET', K_QCONF, 'events', 'maxq')
    events_on(qc[1] or false)
    maxq = count_of(qc[2] or '')
  end

  -- (one plain job without events writes nothing before its record: its refusal, if any, comes
  -- first, so the most common call skips the checks)
  do
    local one = runs[1]
    local lone = total == 1 and one and one.k == 1 and one.g == '' and one.u == '' and one.bid == ''
    if redis.acl_check_cmd and not (lone and not events_on()) then
      local no = events_on() and refused('XADD', K_EVENTS, '*', 'k', 'x')
      for _, run in ipairs(runs) do
        no = no or (run.g ~= '' and refused('ZADD', lane_key(run.g), '0', 'x'))
          or (run.bid ~= '' and run.bhome == ''
            and refused('ZADD', batch_key(run.bid) .. ':all', '0', 'x'))
        for p = run.first, run.first + (run.k - 1) * run.step, run.step do
          if no then return no end
          no = refused('HSET', job_key(ARGV[p]), 's', 'x')
            or (run.step == 3 and refused('SET', BASE .. 'unique:' .. ARGV[p + 2], 'x'))
        end
        if no then return no end
      end
    end
  end

  -- backpressure (qconf maxq): the backlog's exact count (lib/core: every lane, every group,
  -- scheduled, waiting aside on limits; O(1)) and the jobs of the call that are new (a retried
  -- enqueue of stored jobs is never refused), before any write: all or nothing
  if maxq and maxq > 0 then  -- (0, which the setter never writes, is no limit)
    local waiting = BL.total()
    local new = 0
    for _, run in ipairs(runs) do
      for p = run.first, run.first + (run.k - 1) * run.step, run.step do
        if call('EXISTS', job_key(ARGV[p])) == 0 then new = new + 1 end
      end
    end
    if new > 0 and waiting + new > maxq then
      local wait_ms = count_of(call('HGET', K_QCONF, 'maxq_wait') or '') or 0
      call('HINCRBY', K_STATS, 'refused', 1)  -- the call's one write: its refusal, counted
      return redis.error_reply('QUEUEFULL ' .. waiting .. ' ' .. maxq .. ' ' .. wait_ms)
    end
  end

  for _, run in ipairs(runs) do
    local task, m, delay, at = run.task, run.m, run.delay, run.at
    local pr, g, bid, bhome, opts = run.pr, run.g, run.bid, run.bhome, run.opts
    pos = run.first
    local due = -1
    if delay >= 0 then due = now + delay elseif at >= 0 then due = at end
    local state = 'queued'
    if due > now then state = 'scheduled' end
    local fields = REC.new(task, '', m, now)
    fields[#fields + 1] = 's'; fields[#fields + 1] = state
    if pr ~= '0' then fields[#fields + 1] = 'pr'; fields[#fields + 1] = pr end
    if g ~= '' then fields[#fields + 1] = 'g'; fields[#fields + 1] = g end
    if opts ~= '' then fields[#fields + 1] = 'o'; fields[#fields + 1] = opts end
    if state == 'scheduled' then fields[#fields + 1] = 'due'; fields[#fields + 1] = due end
    if bid ~= '' then fields[#fields + 1] = 'b'; fields[#fields + 1] = bid end
    if bid ~= '' and bhome ~= '' then
      fields[#fields + 1] = 'bh'; fields[#fields + 1] = bhome
      fields[#fields + 1] = 'bm'; fields[#fields + 1] = ''
    end
    local bm = #fields
    -- a unique run: each job has its key; the record names its lock (uk) unless only the TTL
    -- ends it (scope t)
    local step, uttl, uscope, uk = 2, nil, nil, nil
    if run.u ~= '' then
      step, uscope, uttl = 3, string.sub(run.u, 1, 1), string.sub(run.u, 2)
      if uscope ~= 't' then
        fields[#fields + 1] = 'uk'; fields[#fields + 1] = ''
        uk = #fields
      end
    end
    for _ = 1, run.k do  -- (run's fields, not locals: the script is near Lua's 200 locals)
      local id = ARGV[pos]
      local jk = job_key(id)
      fields[4] = ARGV[pos + 1]
      local ukey = uttl and ARGV[pos + 2]
      pos = pos + step
      local holder = call('EXISTS', jk) == 1 and 0
      if holder and not in_place(id, jk) then holder = false end
      if not holder and ukey then
        holder = take_lock(BASE .. 'unique:' .. ukey, id, uttl, uscope)
        if uk then fields[uk] = uscope .. ':' .. ukey end
      end
      if holder then
        out[#out + 1] = holder
      else
        if bid ~= '' and bhome ~= '' then fields[bm] = ARGV[1] .. id end
        call('HSET', jk, unpack(fields))
        if state == 'scheduled' then
          call('ZADD', K_SCHED, due, id)
          scheduled = true
          out[#out + 1] = 2
        else
          if g == '' and pr == '0' then plain[#plain + 1] = id else push_ready(id, pr, false, g) end
          runnable = runnable + 1
          out[#out + 1] = 1
        end
        if bid ~= '' and bhome == '' then batch_add(bid, id) end
        added = added + 1
        BL.note(new_tasks, new_counts, task, 1)
        emit_add('enqueued', id, task, 0, nil, state == 'scheduled' and due or nil)
      end
    end
  end
end
-- the plain FIFO lane gets its new jobs in one push, in order; when nothing else is runnable
-- the first ones go to a parked worker without passing through it (HO.direct, lib/handoff,
-- which also counts those it took out of the backlog counts written below)
-- parked: where hand_off starts (HO.direct; false: no worker is parked, hand_off is skipped);
-- lane_on: plain jobs were pushed, so the plain lane is in the ring (runnable jobs remain:
-- has_ready is not asked)
local parked, lane_on = true, false
do
  local took = 0
  if #plain > 0 then took, parked = HO.direct(plain, now, new_tasks, new_counts,
    qc and qc.heads) end
  for i = took + 1, #plain, MAX_JOBS_PER_CALL do
    call('RPUSH', K_READY, unpack(plain, i, math.min(i + MAX_JOBS_PER_CALL - 1, #plain)))
  end
  if #plain > took then
    join_ring('')
    lane_on = true
  end
  runnable = runnable - took
end
if added > 0 then
  call('HINCRBY', K_STATS, 'enqueued', added)
  BL.many(new_tasks, new_counts)
end
if added > 0 or runnable > 0 or scheduled then
  -- idle workers parked by their last claim get the new jobs handed over at once; a wake
  -- token for the jobs left over, and for a delayed job that may fall due before an idle
  -- consumer's current wake-up time
  local more
  if runnable > 0 and parked then more = hand_off(now, parked ~= true and parked or nil) end
  if more == nil then more = lane_on or has_ready() end
  if scheduled or more then wake() end
end
emit_flush()
return out
