--[[ release: give active jobs back to the queue without finishing them, fenced by lease tokens
  (pull-API release, or a worker shutting down). A refunded attempt does not count toward
  max_attempts.
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] delay ms (0: runnable now, ahead of its priority level)
  ARGV[3] refund the attempt (1) or not (0)   ARGV[4] dead_ttl_ms   ARGV[5] n (at most
  MAX_ACKS_PER_CALL)
  then n pairs: id, lease token
  A job released without a refund on its last attempt is dead-lettered (AttemptsExhausted).
  The released token is also kept as rl: a later fail or complete with it is stale; a resent
  release answers 1 again (while nobody has leased the job since). The attempt's end goes
  into the job's history (hx, see lib/history).
  Returns {code_1, ..., code_n}: 1 released (also when this token already released it: a
  resent ack), -1 no such job, -2 lease token mismatch ]]
local delay, refund = tonumber(ARGV[2]), ARGV[3] == '1'
local dead_ttl, n = tonumber(ARGV[4]), tonumber(ARGV[5])
check_count(n, MAX_ACKS_PER_CALL)
local now = now_ms()
local out = {}
local any = false
for i = 0, n - 1 do
  local id, tok = ARGV[6 + i * 2], ARGV[7 + i * 2]
  local jk = job_key(id)
  local r = call('HMGET', jk, 's', 'l', 'pr', 'g', 'a', 'm', 'wk', 'rl')
  if not r[1] then
    out[#out + 1] = -1
  elseif r[8] == tok and r[2] == tok and r[1] ~= 'active' then
    out[#out + 1] = 1
  elseif r[1] ~= 'active' or r[2] ~= tok then
    out[#out + 1] = -2
  else
    release_job(id, jk, r, tok, delay, refund, now, dead_ttl)
    any = true
    out[#out + 1] = 1
  end
end
if any then wake() end
return out
