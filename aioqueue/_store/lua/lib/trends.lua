--[[ trends: compact counters for the dashboard's trends, one HASH per time bucket:
  base.."tr:m:"..minute (kept 61 minutes) and base.."tr:h:"..hour (kept 7 days and an hour),
  by the server's clock. Fields: '<kind>:<task>' (kind c completed, f dead-lettered) the jobs
  of a task that ended so in the bucket, at most TREND_FIELDS such fields a bucket (later
  tasks count in '<kind>:*'), written by the scripts that end jobs, one HINCRBY per task and
  bucket; 'b'
  and 'w' the highest backlog (queued jobs) and wait (ms, the oldest runnable job's) that a
  worker's beat sampled in the bucket. And in a second hash per bucket (its key..':t', same
  TTL), per task: 'b:<task>' the highest backlog sampled (lib/core BL) and 'w:<task>' the
  longest wait (ms from due to start) of its jobs started in the bucket (see task_sample), at
  most BACKLOG_TASKS + 1 of each. A bucket's TTL is set by its first field, so garbage
  in a bucket lasts until it expires (a counter that is not one is set aside by call).
  Needs: core (call, count_of). ]]

local TREND_FIELDS = 100
-- {bucket ms, kept ms} of the minute and the hour buckets
local TREND_RES = {{'m', 60000, 3660000}, {'h', 3600000, 608400000}}

local function trend_key(res, now)
  return BASE .. 'tr:' .. res[1] .. ':' .. math.floor(now / res[2])
end

-- count jobs of a kind ('c', 'f') per task into this minute's and hour's buckets: tasks
-- the task names in order of first sight, counts task -> jobs
local function trend(kind, tasks, counts, now)
  for _, res in ipairs(TREND_RES) do
    local key = trend_key(res, now)
    for _, task in ipairs(tasks) do
      local n = counts[task]
      local field = kind .. ':' .. task
      if call('HINCRBY', key, field, n) == n then
        -- a new field: bound the bucket, and (for its first one) give it its TTL
        if call('HLEN', key) > TREND_FIELDS then
          call('HDEL', key, field)
          call('HINCRBY', key, kind .. ':*', n)
        end
        call('PEXPIRE', key, res[3])
      end
    end
  end
end

-- per task, what a sample adds: 'b:'..task its backlog now (base.."backlog", lib/core BL) and
-- 'w:'..task the longest wait (ms from due to start) of its jobs started since the last
-- sample (base.."twait", written by the claim, taken here); each bounded by BACKLOG_TASKS + 1
-- ('*': the tasks past them). Returns {field, value} pairs
local function task_sample()
  local per = {}
  local bk = BASE .. 'backlog'
  if call('HLEN', bk) <= BACKLOG_TASKS + 1 then
    local kv = call('HGETALL', bk)
    for i = 1, #kv, 2 do
      local n, task = count_of(kv[i + 1]), kv[i]
      if string.sub(task, 1, 2) == 't:' then task = string.sub(task, 3) end
      if n then per[#per + 1] = {'b:' .. task, n} end
    end
  end
  local tw = BASE .. 'twait'
  local zs = call('ZRANGE', tw, 0, BACKLOG_TASKS, 'WITHSCORES')
  if #zs > 0 then call('ZREMRANGEBYRANK', tw, 0, BACKLOG_TASKS) end
  for i = 1, #zs, 2 do
    local w = num(zs[i + 1], -1)
    if w >= 0 and w <= MAX_COUNT then per[#per + 1] = {'w:' .. zs[i], math.floor(w)} end
  end
  return per
end

-- keep the higher of each pair {field, value} of per in hash key (its TTL: res's)
local function keep_highest(key, per, res)
  local fields = {}
  for i, p in ipairs(per) do fields[i] = p[1] end
  local old = call('HMGET', key, unpack(fields))
  local set = {}
  for i, p in ipairs(per) do
    if p[2] > (count_of(old[i]) or -1) then
      set[#set + 1] = p[1]
      set[#set + 1] = p[2]
    end
  end
  if #set > 0 then call('HSET', key, unpack(set)) end
  call('PEXPIRE', key, res[3])
end

-- a worker's sample of its queue: keep the highest backlog and wait of each bucket, of the
-- queue ('b', 'w') and, in the bucket's second hash (its key..':t'), of each task
-- (task_sample)
local function trend_sample(backlog, wait, now)
  local per = task_sample()
  for _, res in ipairs(TREND_RES) do
    local key = trend_key(res, now)
    keep_highest(key, {{'b', backlog}, {'w', wait}}, res)
    if #per > 0 then keep_highest(key .. ':t', per, res) end
  end
end
