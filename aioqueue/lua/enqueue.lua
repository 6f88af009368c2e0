--[[ enqueue: add jobs, immediate or delayed; idempotent on the job id.
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] r, the number of runs: jobs that share everything but id and payload
  then per run: 9 template values: task, max_attempts, delay_ms (-1 none), at_ms (-1 none),
  priority, group ('' none), batch id ('' none), the batch's queue when it is another one ('' =
  this queue; the caller then has counted the job into its batch there), options JSON ('' none);
  then k, the number of jobs in the run, and k pairs: id, payload
  Returns {now_ms, code_1, ..., code_n}, one code per job in order: 1 queued, 2 scheduled, 0 a job
  with this id exists ]]
local now = now_ms()
local out = {now}
local pos = 3
local added = 0
local runnable = 0
local plain = {}
local scheduled = false
for _ = 1, tonumber(ARGV[2]) do
  local task, m, delay, at = ARGV[pos], ARGV[pos + 1], tonumber(ARGV[pos + 2]), tonumber(ARGV[pos + 3])
  local pr, g, bid, bhome, opts = ARGV[pos + 4], ARGV[pos + 5], ARGV[pos + 6], ARGV[pos + 7], ARGV[pos + 8]
  local k = tonumber(ARGV[pos + 9])
  pos = pos + 10
  local due = -1
  if delay >= 0 then due = now + delay elseif at >= 0 then due = at end
  local state = 'queued'
  if due > now then state = 'scheduled' end
  local fields = {'t', task, 'p', '', 'a', 0, 'm', m, 'ct', now, 's', state}
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
  for _ = 1, k do
    local id = ARGV[pos]
    local jk = job_key(id)
    fields[4] = ARGV[pos + 1]
    pos = pos + 2
    if call('EXISTS', jk) == 1 then
      out[#out + 1] = 0
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
    end
  end
end
-- the plain FIFO lane gets its new jobs in one push, in order
for i = 1, #plain, MAX_JOBS_PER_CALL do
  call('RPUSH', K_READY, unpack(plain, i, math.min(i + MAX_JOBS_PER_CALL - 1, #plain)))
end
if #plain > 0 then join_ring('') end
if added > 0 then
  call('HINCRBY', K_STATS, 'enqueued', added)
  -- idle workers parked by their last claim get the new jobs handed over at once; a wake
  -- token for the jobs left over, and for a delayed job that may fall due before an idle
  -- consumer's current wake-up time
  if runnable > 0 then hand_off(now) end
  if scheduled or has_ready() then wake() end
end
return out
