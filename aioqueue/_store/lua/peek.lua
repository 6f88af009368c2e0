--[[ peek: read the same fields of many jobs in one call (a listing's page), cheaper for the
  client than a pipeline of HMGETs. Read only.
  KEYS[1..13] the shared transition keys (see lib/core; none is used)
  ARGV[1] key base   ARGV[2] k, the number of fields   ARGV[3..2+k] the fields
  ARGV[3+k..] job ids (at most MAX_JOBS_PER_CALL)
  Returns the k values of each job in turn (nil where a field or the record is missing) ]]
local k = tonumber(ARGV[2])
if k < 0 or k > 16 then error('aioqueue: 0 to 16 fields a call, not ' .. k, 0) end
check_count(#ARGV - 2 - k)
local fields = {}
for i = 3, 2 + k do fields[#fields + 1] = ARGV[i] end
local out = {}
for i = 3 + k, #ARGV do
  local r = call('HMGET', job_key(ARGV[i]), unpack(fields))
  for j = 1, k do out[#out + 1] = r[j] end
end
return out
