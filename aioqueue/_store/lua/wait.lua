--[[ wait: a running job's durable wait (ctx.sleep, ctx.wait_for_event), number ARGV[4] of its
  run, fenced by the lease token. The first time, the wait's end (now + ARGV[5] ms, by the
  server's clock) is recorded in the job's step hash (field "d:"..n); each run then either
  goes on (the wait is over: the time passed, or a signal's payload is recorded in field
  "w:"..n by signal.lua) or parks: the job is given back, its attempt refunded (giveback),
  scheduled at the wait's end (no worker holds it, nobody polls), and, for an event, its id
  added to the event's SET base.."evt:"..key (which expires a minute after its last waiter's
  end) with the record naming its wait (wv: the key, wn: the number).
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] job id   ARGV[3] lease token   ARGV[4] the wait's number
  ARGV[5] ms to wait from its first call   ARGV[6] the event key ('' for a sleep)
  ARGV[7] dead_ttl ms (a job released on its last attempt without a refund: never here)
  Returns {1, payload}: an event's payload recorded; {2}: over by time (a sleep done, an
  event's wait timed out; the job leaves the event's set); {3, end ms}: parked; {-1}: no such
  job; {-2}: lease token mismatch (nothing written) ]]
local id, tok, n, key = ARGV[2], ARGV[3], ARGV[4], ARGV[6]
local jk = job_key(id)
local r = call('HMGET', jk, 's', 'l', 'pr', 'g', 'a', 'm', 'wk', 'ct')
if not r[1] then return {-1} end
if r[1] ~= 'active' or r[2] ~= tok then return {-2} end
local now = now_ms()
local sk, kept = steps_of(id, r[8])
local ek = BASE .. 'evt:' .. key
if kept and key ~= '' then
  local v = call('HGET', sk, 'w:' .. n)
  if v then return {1, v} end
end
-- a recorded end that is garbage counts as passed: the wait ends rather than never
local raw = kept and call('HGET', sk, 'd:' .. n)
local due = raw and (count_of(raw) or 0)
if not due then
  due = now + tonumber(ARGV[5])
  call('HSET', sk, 'ct', r[8] or '', 'd:' .. n, due)
  call('HSET', jk, 'xk', 1)
end
if due <= now then
  if key ~= '' then
    call('SREM', ek, id)
    call('HDEL', jk, 'wv', 'wn')
  end
  return {2}
end
if key ~= '' then
  call('SADD', ek, id)
  if call('PTTL', ek) < due - now + 60000 then call('PEXPIRE', ek, due - now + 60000) end
  call('HSET', jk, 'wv', key, 'wn', n)
end
release_job(id, jk, r, tok, due - now, true, now, tonumber(ARGV[7]))
wake()
return {3, due}
