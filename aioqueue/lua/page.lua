--[[ page: read a page of the plain FIFO lane (the ready LIST, consumed at its head) after, or
  newest first before, the first of some anchor ids still in it: finding the anchor and reading
  the page are one atomic step, so consumers popping the head cannot shift the list between
  them. Read only. The anchor is looked for within 1,000 places of where it was, then by LPOS.
  KEYS[1] the ready list
  ARGV[1] key base (unused)   ARGV[2] n   ARGV[3] 1 newest first, 0 oldest first
  ARGV[4] where the first anchor was (index from the head)
  ARGV[5..] anchor ids, the preferred first (none: start at the head, or newest first the tail)
  Returns {index of the first id read, id, ...} (oldest first), or {-1} when newest first and
  every anchor left the list (consumed from the head, and with it everything older) ]]
local key, n, rev, pos = KEYS[1], tonumber(ARGV[2]), ARGV[3] == '1', tonumber(ARGV[4])
local at = nil
if #ARGV >= 5 then
  local rank = {}
  for i = 5, #ARGV do rank[ARGV[i]] = i end
  local lo = math.max(0, pos - 1000)
  local best = nil
  for j, v in ipairs(redis.call('LRANGE', key, lo, pos + 1000)) do
    local r = rank[v]
    if r and (not best or r < best) then best, at = r, lo + j - 1 end
  end
  if not at then
    for i = 5, #ARGV do
      local p = redis.call('LPOS', key, ARGV[i])
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
