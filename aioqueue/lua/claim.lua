--[[ claim: lease up to n runnable jobs. Lanes (the default lane and each group) are served
  round-robin, one job per turn (a lane alone in the ring gives all it can at once); within a
  lane, higher priority first and FIFO within a priority. Groups' concurrency limits, rate
  limits (per queue and per group) and pauses (of the queue or a group) are applied here.
  Before taking jobs it hands back expired leases and promotes due delayed jobs, so one call
  is all a consumer needs; it leaves a wake token when runnable jobs remain for others.
  KEYS[1..13] the shared transition keys (see _lib)
  ARGV[1] key base   ARGV[2] n (>= 0)   ARGV[3] lease_ms   ARGV[4] dead_ttl_ms
  Returns {now_ms, next_wake_ms, id_1, token_1, attempt_1, task_1, payload_1, options_1,
  max_attempts_1, ...}: 7 values per leased job; next_wake_ms (-1: nothing pending) is set only
  when fewer than n jobs were leased. ]]
local want = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local dead_ttl = tonumber(ARGV[4])
local now = now_ms()
recover(now, 100, dead_ttl)
promote(now, math.max(want, 100))

local q = redis.call('HMGET', K_QCONF, 'paused', 'rate_n', 'rate_ms', 'glimit', 'grate_n', 'grate_ms')
local rate_wake = -1
local qrate_key = nil
if q[1] then want = 0 end
if want > 0 and q[2] then
  local rn, rms = tonumber(q[2]), tonumber(q[3])
  local window = math.floor(now / rms)
  qrate_key = BASE .. 'qrate:' .. window
  local left = rn - (tonumber(redis.call('GET', qrate_key)) or 0)
  if left <= 0 then
    want = 0
    rate_wake = (window + 1) * rms
  elseif left < want then
    want = left
  end
end
local glimit_default, grate_n_default, grate_ms_default = tonumber(q[4]), tonumber(q[5]), tonumber(q[6])

local function pop_default(room)
  local ids = {}
  -- priority above 0 (negative scores), then the plain FIFO lane, then priority below 0
  local hi = redis.call('ZRANGEBYSCORE', K_PRIO, '-inf', '(0', 'LIMIT', 0, room)
  if #hi > 0 then
    redis.call('ZREM', K_PRIO, unpack(hi))
    for _, id in ipairs(hi) do ids[#ids + 1] = id end
  end
  if #ids < room then
    local plain = redis.call('LPOP', K_READY, room - #ids)
    if plain then for _, id in ipairs(plain) do ids[#ids + 1] = id end end
  end
  if #ids < room then
    local lo = redis.call('ZPOPMIN', K_PRIO, room - #ids)
    for i = 1, #lo, 2 do ids[#ids + 1] = lo[i] end
  end
  return ids
end

local out = {now, -1}
local zargs = {}
local taken_total = 0
local guard = 2 * want + 100
while taken_total < want and guard > 0 do
  guard = guard - 1
  local head = redis.call('ZRANGE', K_RING, 0, 0)
  if #head == 0 then break end
  local g = head[1]
  local room = want - taken_total
  if room > 1 and redis.call('ZCARD', K_RING) > 1 then room = 1 end
  local blocked, wait_until = false, nil
  local limit, active, rate_key, rate_n, rate_ms, rate_used = nil, 0, nil, nil, nil, 0
  if g ~= '' then
    if redis.call('HEXISTS', K_GCONF, 'paused:' .. g) == 1 then
      blocked = true
    else
      limit = tonumber(redis.call('HGET', K_GCONF, 'limit:' .. g)) or glimit_default
      if limit then
        active = tonumber(redis.call('HGET', K_GACTIVE, g)) or 0
        if active >= limit then blocked = true elseif limit - active < room then room = limit - active end
      end
      rate_n = tonumber(redis.call('HGET', K_GCONF, 'rate_n:' .. g)) or grate_n_default
      if rate_n and not blocked then
        rate_ms = tonumber(redis.call('HGET', K_GCONF, 'rate_ms:' .. g)) or grate_ms_default
        local window = math.floor(now / rate_ms)
        rate_key = BASE .. 'grate:' .. g .. ':' .. window
        rate_used = tonumber(redis.call('GET', rate_key)) or 0
        if rate_used >= rate_n then
          blocked, wait_until = true, (window + 1) * rate_ms
        elseif rate_n - rate_used < room then
          room = rate_n - rate_used
        end
      end
    end
  end
  local got = {}
  if not blocked then
    if g == '' then
      got = pop_default(room)
    else
      local z = redis.call('ZPOPMIN', lane_key(g), room)
      for i = 1, #z, 2 do got[#got + 1] = z[i] end
    end
  end
  local taken = 0
  local tok = 0
  if #got > 0 then tok = redis.call('INCRBY', K_SEQ, #got) - #got end
  for _, id in ipairs(got) do
    local jk = job_key(id)
    local r = redis.call('HMGET', jk, 's', 'a', 't', 'p', 'o', 'm')
    -- anything not queued (cancelled, or its record expired) is dropped from the lane here
    if r[1] == 'queued' then
      tok = tok + 1
      taken = taken + 1
      local a = (tonumber(r[2]) or 0) + 1
      redis.call('HSET', jk, 's', 'active', 'a', a, 'l', tok)
      zargs[#zargs + 1] = now + lease
      zargs[#zargs + 1] = id
      local n = #out
      out[n + 1] = id
      out[n + 2] = tok
      out[n + 3] = a
      out[n + 4] = r[3] or ''
      out[n + 5] = r[4] or ''
      out[n + 6] = r[5] or ''
      out[n + 7] = tonumber(r[6]) or 1
    end
  end
  taken_total = taken_total + taken
  if g ~= '' and taken > 0 then
    active = redis.call('HINCRBY', K_GACTIVE, g, taken)
    if rate_key then
      rate_used = redis.call('INCRBY', rate_key, taken)
      redis.call('PEXPIRE', rate_key, 2 * rate_ms)
    end
  end
  -- the lane's next turn: back of the ring, or parked until what blocks it is lifted
  local empty
  if g == '' then
    empty = redis.call('LLEN', K_READY) == 0 and redis.call('ZCARD', K_PRIO) == 0
  else
    empty = redis.call('EXISTS', lane_key(g)) == 0
    if not blocked and limit and active >= limit then blocked = true end
    if not blocked and rate_key and rate_used >= rate_n then
      blocked, wait_until = true, (math.floor(now / rate_ms) + 1) * rate_ms
    end
  end
  if empty or blocked then
    redis.call('ZREM', K_RING, g)
    if wait_until and not empty then redis.call('ZADD', K_GWAIT, wait_until, g) end
  else
    redis.call('ZADD', K_RING, redis.call('INCR', K_SEQ), g)
  end
end

if #zargs > 0 then redis.call('ZADD', K_ACTIVE, unpack(zargs)) end
if qrate_key and taken_total > 0 then
  redis.call('INCRBY', qrate_key, taken_total)
  redis.call('PEXPIRE', qrate_key, 2 * tonumber(q[3]))
end
if has_ready() then wake() end
if taken_total < tonumber(ARGV[2]) then
  local nw = next_wake()
  if rate_wake >= 0 and (nw < 0 or rate_wake < nw) then nw = rate_wake end
  out[2] = nw
end
return out
