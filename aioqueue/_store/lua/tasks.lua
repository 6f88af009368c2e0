--[[ tasks: a queue's task table, the task names its live workers serve with their declared
  defaults. A worker writes it when it starts (and again every minute), enqueue by name reads it.
  KEYS[1..13] the shared transition keys (see lib/core; only the registry's clock is used)
  ARGV[1] key base   ARGV[2] 'put' or 'get'
  A table of more than 1,000 names is planted garbage: set aside (listed in garbled) first.
  put: ARGV[3] worker id   ARGV[4..] pairs of task name, its defaults (JSON), at most 1,000
    Each entry ("<wid> <wid>...\n<defaults>") keeps the ids of at most 8 live workers that
    declared the task, this one last; an entry no live worker declared any more is dropped.
    Returns the number of entries left. The table expires 10 minutes after its last write.
  get: ARGV[3] task name   ARGV[4] most names returned
    Returns {live, defaults}: live 1 if a live worker is registered on the queue; the task's
    defaults if a live worker declared it, else false and then the names that live workers
    declared (at most ARGV[4]). ]]
local T = BASE .. 'tasks'
local now = now_ms()
-- the table holds what live workers serve: past MAX_JOBS_PER_CALL names it is planted garbage,
-- set aside (listed in garbled) so that no call reads more than that (I13)
local MAX_TASKS = MAX_JOBS_PER_CALL
local TABLE_TTL_MS = 600000  -- ten of the workers' one-minute rewrites
if call('HLEN', T) > MAX_TASKS then set_aside(T, 'more than ' .. MAX_TASKS .. ' task names') end

local function is_live(wid)
  local s = call('ZSCORE', K_WORKERS, wid)
  return s and num(s, 0) > now
end

-- an entry's live workers and its defaults (garbage: no workers)
local function parse(raw)
  local ids, defaults = {}, ''
  if type(raw) == 'string' then
    local nl = string.find(raw, '\n', 1, true)
    if nl then
      defaults = string.sub(raw, nl + 1)
      for wid in string.gmatch(string.sub(raw, 1, nl - 1), '%S+') do
        if is_live(wid) then ids[#ids + 1] = wid end
      end
    end
  end
  return ids, defaults
end

if ARGV[2] == 'put' then
  check_count(math.floor((#ARGV - 3) / 2))  -- before any write
  local me = ARGV[3]
  local mine = {}
  for i = 4, #ARGV - 1, 2 do
    local ids = parse(call('HGET', T, ARGV[i]))
    local keep = {}
    for _, wid in ipairs(ids) do
      if wid ~= me then keep[#keep + 1] = wid end
    end
    while #keep > 7 do table.remove(keep, 1) end
    keep[#keep + 1] = me
    call('HSET', T, ARGV[i], table.concat(keep, ' ') .. '\n' .. ARGV[i + 1])
    mine[ARGV[i]] = true
  end
  -- drop what no live worker declares any more (the table stays as large as what they serve)
  local all = call('HGETALL', T)
  for i = 1, #all, 2 do
    if not mine[all[i]] and #parse(all[i + 1]) == 0 then call('HDEL', T, all[i]) end
  end
  -- a table whose workers all went away expires (they rewrite it every minute: I8)
  call('PEXPIRE', T, TABLE_TTL_MS)
  return call('HLEN', T)
end

local live = #call('ZRANGEBYSCORE', K_WORKERS, '(' .. now, '+inf', 'LIMIT', 0, 1) > 0
local ids, defaults = parse(call('HGET', T, ARGV[3]))
if #ids > 0 then return {1, defaults} end
local out = {live and 1 or 0, false}
if live then
  local limit = math.min(num(ARGV[4], 0), MAX_TASKS)
  local all = call('HGETALL', T)
  for i = 1, #all, 2 do
    if #out - 2 >= limit then break end
    if #parse(all[i + 1]) > 0 then out[#out + 1] = all[i] end
  end
end
return out
