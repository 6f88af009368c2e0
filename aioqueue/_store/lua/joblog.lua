--[[ joblog: append lines to a running job's log (ctx.log, and its captured logging
  records), fenced by the lease token like an ack. The log is the job's extra LIST
  base.."log:"..id (extras_of), one entry per line, with the record's field lb the bytes it
  holds; the oldest lines are dropped past JOB_LOG_LINES lines or JOB_LOG_BYTES bytes (each
  line is cut to the byte cap by the caller). A log that is not a LIST is set aside (call);
  a garbage lb counts as 0 (the line cap still bounds the log).
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] job id   ARGV[3] lease token   ARGV[4..] the lines (at most
  JOB_LOG_LINES a call)
  Returns 1 appended, -1 no such job, -2 lease token mismatch (nothing written) ]]
local id, tok = ARGV[2], ARGV[3]
local jk = job_key(id)
local r = call('HMGET', jk, 's', 'l', 'lb')
if not r[1] then return -1 end
if r[1] ~= 'active' or r[2] ~= tok then return -2 end
local n = #ARGV - 3
check_count(n, JOB_LOG_LINES)
local _, lk = extras_of(id)
local bytes = count_of(r[3]) or 0
local lines = {}
for i = 4, #ARGV do
  lines[#lines + 1] = ARGV[i]
  bytes = bytes + #ARGV[i]
end
local len = call('RPUSH', lk, unpack(lines))
while len > 0 and (len > JOB_LOG_LINES or bytes > JOB_LOG_BYTES) do
  local old = call('LPOP', lk)
  if not old then break end
  bytes = bytes - #old
  len = len - 1
end
if bytes < 0 then bytes = 0 end
call('HSET', jk, 'xk', 1, 'lb', bytes)
return 1
