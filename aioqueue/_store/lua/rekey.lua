--[[ rekey: store values signed and encrypted again with the first keys (an operator's
  `rekey`), each entry only if every value it replaces is still the one that was read: a
  compare-and-set per entry, so a job that finished, was retried, replaced or deleted
  meanwhile is left as it is (and counted as changed).
  KEYS[1..13] the shared transition keys (see lib/core; none is touched here)
  ARGV[1] key base   then per entry: ARGV[i] a hash under the key base ('job:<id>' or
  'batch:<id>:res'), ARGV[i+1] n, then n triples: field, value read, new value
  Returns {written, changed}
  Garbage (I9): through core's call(), a key of the wrong type is set aside first; it then
  reads as absent, so its entry counts as changed and nothing is written. ]]
-- at most about MAX_JOBS_PER_CALL values (I13), and each entry's n a count that moves on
check_count(math.floor((#ARGV - 1) / 3))
local written, changed = 0, 0
local i = 2
while i <= #ARGV do
  local key = ARGV[1] .. ARGV[i]
  local n = count_of(ARGV[i + 1])
  if not n then error('aioqueue: rekey: not a count: ' .. tostring(ARGV[i + 1]), 0) end
  local same = true
  for j = 0, n - 1 do
    local at = i + 2 + 3 * j
    if call('HGET', key, ARGV[at]) ~= ARGV[at + 1] then same = false end
  end
  if same then
    for j = 0, n - 1 do
      local at = i + 2 + 3 * j
      call('HSET', key, ARGV[at], ARGV[at + 2])
    end
    written = written + 1
  else
    changed = changed + 1
  end
  i = i + 2 + 3 * n
end
return {written, changed}
