--[[ enqueue: add jobs, immediate or delayed; idempotent on the job id.
  KEYS[1..13] the shared transition keys (see _lib)
  ARGV[1] key base   ARGV[2] n, the number of jobs
  then per job 11 values: id, task, payload, max_attempts, delay_ms (-1 none), at_ms (-1 none),
  priority, group ('' none), batch id ('' none), the batch's queue when it is another one
  ('' = this queue; the caller then has counted the job into its batch there), options JSON
  ('' none)
  Returns {now_ms, code_1, ..., code_n}: code 1 queued, 2 scheduled, 0 a job with this id exists ]]
local n = tonumber(ARGV[2])
local now = now_ms()
local out = {now}
local queued, added = 0, 0
for i = 0, n - 1 do
  local b = 3 + i * 11
  local id = ARGV[b]
  local jk = job_key(id)
  if redis.call('EXISTS', jk) == 1 then
    out[#out + 1] = 0
  else
    local delay, at, pr = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]), ARGV[b + 6]
    local g, bid, bhome, opts = ARGV[b + 7], ARGV[b + 8], ARGV[b + 9], ARGV[b + 10]
    local due = -1
    if delay >= 0 then due = now + delay elseif at >= 0 then due = at end
    redis.call('HSET', jk, 't', ARGV[b + 1], 'p', ARGV[b + 2], 'a', 0, 'm', ARGV[b + 3], 'ct', now)
    if pr ~= '0' then redis.call('HSET', jk, 'pr', pr) end
    if g ~= '' then redis.call('HSET', jk, 'g', g) end
    if bid ~= '' then
      redis.call('HSET', jk, 'b', bid)
      if bhome == '' then
        batch_add(bid, id)
      else
        redis.call('HSET', jk, 'bh', bhome, 'bm', ARGV[1] .. id)
      end
    end
    if opts ~= '' then redis.call('HSET', jk, 'o', opts) end
    if due > now then
      redis.call('HSET', jk, 's', 'scheduled', 'due', due)
      redis.call('ZADD', K_SCHED, due, id)
      out[#out + 1] = 2
    else
      redis.call('HSET', jk, 's', 'queued')
      push_ready(id, pr, false, g)
      queued = queued + 1
      out[#out + 1] = 1
    end
    added = added + 1
  end
end
-- a delayed job may fall due before an idle consumer's current wake-up time: wake one to look
if added > 0 then
  wake()
  redis.call('HINCRBY', K_STATS, 'enqueued', added)
end
return out
