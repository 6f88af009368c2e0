--[[ claim: lease up to n runnable jobs, highest priority first, FIFO within a priority.
  Before taking jobs it hands back expired leases and promotes due delayed jobs, so one call is
  all a consumer needs; it leaves a wake token when runnable jobs remain for other consumers.
  KEYS[1..8] the shared transition keys (see _lib)
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

local ids = {}
if want > 0 then
  -- priority above 0 (negative scores), then the plain FIFO lane, then priority below 0
  local hi = redis.call('ZRANGEBYSCORE', K_PRIO, '-inf', '(0', 'LIMIT', 0, want)
  if #hi > 0 then
    redis.call('ZREM', K_PRIO, unpack(hi))
    for _, id in ipairs(hi) do ids[#ids + 1] = id end
  end
  if #ids < want then
    local plain = redis.call('LPOP', K_READY, want - #ids)
    if plain then for _, id in ipairs(plain) do ids[#ids + 1] = id end end
  end
  if #ids < want then
    local lo = redis.call('ZPOPMIN', K_PRIO, want - #ids)
    for i = 1, #lo, 2 do ids[#ids + 1] = lo[i] end
  end
end

local out = {now, -1}
local deadline = now + lease
local zargs = {}
local tok = 0
if #ids > 0 then tok = redis.call('INCRBY', K_SEQ, #ids) - #ids end
for _, id in ipairs(ids) do
  local jk = job_key(id)
  local r = redis.call('HMGET', jk, 's', 'a', 't', 'p', 'o', 'm')
  -- anything not queued (cancelled, or its record expired) is dropped from the lane here
  if r[1] == 'queued' then
    tok = tok + 1
    local a = (tonumber(r[2]) or 0) + 1
    redis.call('HSET', jk, 's', 'active', 'a', a, 'l', tok)
    zargs[#zargs + 1] = deadline
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
if #zargs > 0 then redis.call('ZADD', K_ACTIVE, unpack(zargs)) end
if has_ready() then wake() end
if #zargs < 2 * want then out[2] = next_wake() end
return out
