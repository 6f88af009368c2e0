--[[ history: the attempts of a job that ended other than by success, kept in its record as
  hx, a JSON array of at most HISTORY_MAX entries (the oldest dropped first), each
  {n attempt, w worker ('' a pull-API consumer), s started ms (absent: unknown), e ended ms,
  o outcome, t error type, m error message (at most HISTORY_MSG bytes)}. The claim writes the
  start of each attempt (st) next to its worker (wk); a successful attempt ends in f, so
  completing costs nothing here. Outcomes: retried, failed (dead-lettered), cancelled,
  released, expired (its lease ran out), buried (its worker was declared dead).
  Needs: core. ]]

local HISTORY_MAX = 20
local HISTORY_MSG = 200

-- at most n bytes of s, cut back to the start of a UTF-8 character
local function utf8_prefix(s, n)
  if #s <= n then return s end
  local cut = n
  while cut > 0 do
    local b = string.byte(s, cut + 1)
    if b < 0x80 or b >= 0xC0 then break end
    cut = cut - 1
  end
  return string.sub(s, 1, cut)
end

-- append to job jk's history the end of attempt a, held by worker wk: outcome, and err (the
-- error's JSON, or nil). A garbled history is started afresh (I9: it never stops the script)
local function end_attempt(jk, a, wk, outcome, err, now)
  local r = call('HMGET', jk, 'st', 'hx')
  local entry = {n = num(a, 0), w = wk or '', s = num(r[1], nil), e = now, o = outcome}
  if err then
    local ok, e = pcall(cjson.decode, err)
    if ok and type(e) == 'table' then
      if type(e.type) == 'string' then entry.t = utf8_prefix(e.type, HISTORY_MSG) end
      if type(e.message) == 'string' then entry.m = utf8_prefix(e.message, HISTORY_MSG) end
    end
  end
  local old = {}
  if r[2] then
    local ok, h = pcall(cjson.decode, r[2])
    if ok and type(h) == 'table' then old = h end
  end
  local list = {}
  for i = math.max(1, #old - HISTORY_MAX + 2), #old do
    if type(old[i]) == 'table' then list[#list + 1] = old[i] end
  end
  list[#list + 1] = entry
  call('HSET', jk, 'hx', cjson.encode(list))
end
