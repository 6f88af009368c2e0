--[[ schedule: fire one tick of a periodic schedule, exactly once: if the schedule's stored next
  tick is still ARGV[3] (compare-and-set: a caller that read an older tick is refused) and it
  is due by the server's clock, enqueue the tick's job (unless a job with its id exists: the
  id is derived from schedule and tick, so this is idempotent) and store the next tick, in one
  step. With no job id it only moves the stored tick on (missed ticks skipped).
  KEYS[1..13] the shared transition keys (see lib/core)   KEYS[14] the schedules' next ticks
  (ZSET name -> tick ms)
  ARGV[1] key base   ARGV[2] schedule name   ARGV[3] the stored tick the caller read (ms)
  ARGV[4] the next tick to store (ms)   ARGV[5] job id ('' none)   ARGV[6] payload
  ARGV[7] task   ARGV[8] max attempts   ARGV[9] run at (epoch ms; the tick plus its jitter)
  ARGV[10] priority   ARGV[11] options JSON ('' none)
  Returns {now_ms, code}: 1 the job was enqueued and the tick moved on, 2 the tick moved on
  without a new job (skipped, or its job existed), 0 not due yet, -1 no such schedule, -2 the
  stored tick is another one (someone else fired it), or a tick or run time that is not a
  valid time (an integer in [0, 2^53]; the caller sets such an entry aside, I9/I12) ]]
local name, seen, nxt = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local function valid(n)
  return n ~= nil and n == n and n >= 0 and n <= 9007199254740992 and n == math.floor(n)
end
local run_at = tonumber(ARGV[9])
if not (valid(seen) and valid(nxt) and (run_at == -1 or valid(run_at))) then return {now, -2} end
local stored = call('ZSCORE', KEYS[14], name)
if not stored then return {now, -1} end
if tonumber(stored) ~= seen then return {now, -2} end
if seen > now then return {now, 0} end
call('ZADD', KEYS[14], nxt, name)
local id = ARGV[5]
if id == '' then return {now, 2} end
local jk = job_key(id)
if call('EXISTS', jk) == 1 then return {now, 2} end
local pr, due, opts = ARGV[10], tonumber(ARGV[9]), ARGV[11]
local fields = REC.new(ARGV[7], ARGV[6], ARGV[8], now)
if pr ~= '0' then fields[#fields + 1] = 'pr'; fields[#fields + 1] = pr end
if opts ~= '' then fields[#fields + 1] = 'o'; fields[#fields + 1] = opts end
if due > now then
  fields[#fields + 1] = 's'; fields[#fields + 1] = 'scheduled'
  fields[#fields + 1] = 'due'; fields[#fields + 1] = due
  call('HSET', jk, unpack(fields))
  call('ZADD', K_SCHED, due, id)
else
  fields[#fields + 1] = 's'; fields[#fields + 1] = 'queued'
  call('HSET', jk, unpack(fields))
  push_ready(id, pr, false, '')
end
call('HINCRBY', K_STATS, 'enqueued', 1)
BL.count(ARGV[7], 1)
emit('enqueued', id, ARGV[7], 0, nil, nil, due > now and due or nil)
wake()
return {now, 1}
