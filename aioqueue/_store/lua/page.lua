--[[ page: read a page of the plain FIFO lane (the ready LIST, consumed at its head) after, or
  newest first before, the first of some anchor ids still in it: finding the anchor and reading
  the page are one atomic step, so consumers popping the head cannot shift the list between
  them. Read only. The anchor is looked for within 1,000 places of where it was, then by LPOS.
  Its work is bounded by constants whatever the arguments (I13): n is clamped to 0..1,000,
  only the first 3 anchors are used, and each LPOS looks at most MAX_SCAN places.
  KEYS[1] the ready list
  ARGV[1] key base (unused)   ARGV[2] n   ARGV[3] 1 newest first, 0 oldest first
  ARGV[4] where the first anchor was (index from the head)
  ARGV[5..7] anchor ids, the preferred first (none: start at the head, or newest first the tail)
  Returns {index of the first id read, id, ...} (oldest first), or {-1} when newest first and
  every anchor left the list (consumed from the head, and with it everything older) ]]
-- the most ids a page reads, the anchors used, and the places each LPOS looks at
local MAX_PAGE, MAX_ANCHORS, MAX_SCAN = 1000, 3, 100000
local key, rev = KEYS[1], ARGV[3] == '1'
local n = math.max(0, math.min(tonumber(ARGV[2]) or 0, MAX_PAGE))
local pos = math.floor(math.max(0, math.min(tonumber(ARGV[4]) or 0, 2 ^ 50)))
local last_anchor = math.min(#ARGV, 4 + MAX_ANCHORS)
local at = nil
if last_anchor >= 5 then
  local rank = {}
  for i = 5, last_anchor do rank[ARGV[i]] = i end
  local lo = math.max(0, pos - 1000)
  local best = nil
  for j, v in ipairs(redis.call('LRANGE', key, lo, pos + 1000)) do
    local r = rank[v]
    if r and (not best or r < best) then best, at = r, lo + j - 1 end
  end
  if not at then
    for i = 5, last_anchor do
      local p = redis.call('LPOS', key, ARGV[i], 'MAXLEN', MAX_SCAN)
      if p then at = p; break end
    end
  end
  if not at and rev then return {-1} end
end
local first, last
if rev then
  if not at then at = redis.call('LLEN', key) end
  first, last = math.max(0, at - n), at - 1
else
  first = at and at + 1 or 0
  last = first + n - 1
end
local out = {first}
if last >= first then
  for _, v in ipairs(redis.call('LRANGE', key, first, last)) do out[#out + 1] = v end
end
return out
