--[[ schedules: add, change or remove a queue's periodic schedule (any process can), and set
  aside what is garbage in the schedule keys (I9: it costs at most its own entry).
  KEYS[1] the schedules' definitions (HASH name -> JSON)   KEYS[2] their next ticks (ZSET name
  -> tick ms)   KEYS[3] the queue's garbled record (HASH aside key -> JSON {key, reason, at})
  KEYS[4] the queue's stats (HASH; field garbled counts what was set aside)
  ARGV[1] key base   ARGV[2] the operation, then its arguments:
  put ARGV[3] name   ARGV[4] definition (JSON)   ARGV[5] its first tick (ms), stored when the
    schedule is new or its definition changed (an unchanged one keeps its stored tick, so
    restarting the workers that declare it neither repeats nor skips a tick).
    Returns 1 added, 2 changed, 0 unchanged, -1 the first tick is not a valid time
  remove ARGV[3] name. Returns 1 removed, 0 no such schedule
  aside_def ARGV[3] name   ARGV[4] the definition the caller judged (compare-and-set: a
    definition changed since is left alone)   ARGV[5] reason. The definition is moved to its
    own key (<defs>:<name>:garbled:<ms>), its tick dropped. Returns 1 set aside, 0 changed since
  aside_ticks ARGV[3] reason   ARGV[4..] names: each entry of the ticks that has no definition
    or whose tick is not a valid time is moved to one ZSET (<next>:garbled:<ms>). Returns the
    number moved
  contain: a definitions key that is not a hash, or a ticks key that is not a sorted set, is
    renamed aside. Returns the number renamed
  Every set-aside key is listed in the garbled record with its reason and counted in stats.
  Of the library it uses only core's now_ms (its keys are not a queue's transition keys, so
  it calls Redis directly); put and remove read both keys before they write either, so a key of the
  wrong type fails the call (a typed error to the caller, who then runs contain) before
  anything is changed. ]]
local op = ARGV[2]
-- the largest tick stored: integers up to 2^53 are exact in a Lua number and a JSON double
local MAX_TICK = 9007199254740992

local function valid_tick(v)
  local n = tonumber(v)
  return n ~= nil and n == n and n >= 0 and n <= MAX_TICK and n == math.floor(n)
end

local function free_name(key, now)
  local to, n = key .. ':garbled:' .. now, 0
  while redis.call('EXISTS', to) == 1 do
    n = n + 1
    to = key .. ':garbled:' .. now .. '.' .. n
  end
  return to
end

-- list a set-aside key with its reason (a garbled record or stats of the wrong type is itself
-- renamed aside first, so the note never fails)
local function note(aside, key, reason, count, now)
  for _, k in ipairs({KEYS[3], KEYS[4]}) do
    local kind = redis.call('TYPE', k).ok
    if kind ~= 'hash' and kind ~= 'none' then redis.call('RENAME', k, free_name(k, now)) end
  end
  redis.call('HSET', KEYS[3], aside, cjson.encode({key = key, reason = reason, at = now}))
  if type(redis.pcall('HINCRBY', KEYS[4], 'garbled', count)) == 'table' then
    redis.call('HSET', KEYS[4], 'garbled', count)
  end
end

if op == 'remove' then
  local name = ARGV[3]
  redis.call('ZSCORE', KEYS[2], name)
  local removed = redis.call('HDEL', KEYS[1], name)
  redis.call('ZREM', KEYS[2], name)
  return removed
elseif op == 'put' then
  local name = ARGV[3]
  if not valid_tick(ARGV[5]) then return -1 end
  local old = redis.call('HGET', KEYS[1], name)
  if old == ARGV[4] and valid_tick(redis.call('ZSCORE', KEYS[2], name)) then return 0 end
  redis.call('HSET', KEYS[1], name, ARGV[4])
  redis.call('ZADD', KEYS[2], tonumber(ARGV[5]), name)
  if old then return 2 end
  return 1
elseif op == 'aside_def' then
  local name = ARGV[3]
  if redis.call('HGET', KEYS[1], name) ~= ARGV[4] then return 0 end
  local now = now_ms()
  local to = free_name(KEYS[1] .. ':' .. name, now)
  redis.call('SET', to, ARGV[4])
  redis.call('HDEL', KEYS[1], name)
  redis.call('ZREM', KEYS[2], name)
  note(to, KEYS[1], 'schedule ' .. name .. ': ' .. ARGV[5], 1, now)
  return 1
elseif op == 'aside_ticks' then
  local now, to, moved = now_ms(), nil, 0
  for i = 4, #ARGV do
    local name = ARGV[i]
    local tick = redis.call('ZSCORE', KEYS[2], name)
    if tick and (redis.call('HEXISTS', KEYS[1], name) == 0 or not valid_tick(tick)) then
      to = to or free_name(KEYS[2], now)
      redis.call('ZADD', to, tick, name)
      redis.call('ZREM', KEYS[2], name)
      moved = moved + 1
    end
  end
  if moved > 0 then note(to, KEYS[2], moved .. ' ' .. ARGV[3], moved, now) end
  return moved
elseif op == 'contain' then
  local now, n = now_ms(), 0
  for i, want in ipairs({'hash', 'zset'}) do
    local kind = redis.call('TYPE', KEYS[i]).ok
    if kind ~= want and kind ~= 'none' then
      local to = free_name(KEYS[i], now)
      redis.call('RENAME', KEYS[i], to)
      note(to, KEYS[i], 'wrong type: ' .. kind .. ', not a ' .. want, 1, now)
      n = n + 1
    end
  end
  return n
end
return redis.error_reply('schedules: unknown operation ' .. tostring(op))
