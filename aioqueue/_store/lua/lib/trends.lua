--[[ trends: compact counters for the dashboard's trends, one HASH per time bucket:
  base.."tr:m:"..minute (kept 61 minutes) and base.."tr:h:"..hour (kept 7 days and an hour),
  by the server's clock. Fields: '<kind>:<task>' (kind c completed, f dead-lettered) the jobs
  of a task that ended so in the bucket, at most TREND_FIELDS such fields a bucket (later
  tasks count in '<kind>:*'), written by the scripts that end jobs, one HINCRBY per task and
  bucket; 'b'
  and 'w' the highest backlog (queued jobs) and wait (ms, the oldest runnable job's) that a
  worker's beat sampled in the bucket. A bucket's TTL is set by its first field, so garbage
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

-- a worker's sample of its queue: keep the highest backlog and wait of each bucket
local function trend_sample(backlog, wait, now)
  for _, res in ipairs(TREND_RES) do
    local key = trend_key(res, now)
    local old = call('HMGET', key, 'b', 'w')
    if backlog > (count_of(old[1]) or -1) then call('HSET', key, 'b', backlog) end
    if wait > (count_of(old[2]) or -1) then call('HSET', key, 'w', wait) end
    call('PEXPIRE', key, res[3])
  end
end
