--[[ signal: wake the jobs parked waiting for event ARGV[2] (wait.lua), at most
  MAX_JOBS_PER_CALL a call (I13: the caller calls again while some remain). Each member of
  the event's SET whose record is still scheduled and still names this wait (wv) gets the
  payload recorded as its wait's result (field "w:"..wn of its step hash) and becomes
  runnable at once (back of its lane); a member that no longer waits for it (finished,
  cancelled, removed, woken by its timeout) is dropped.
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] event key   ARGV[3] the payload (sealed by the caller for this
  queue and key)
  Returns {woken, members left} ]]
local key = ARGV[2]
local ek = BASE .. 'evt:' .. key
local ids = call('SPOP', ek, MAX_JOBS_PER_CALL)
local woken = 0
for _, id in ipairs(ids) do
  local jk = job_key(id)
  local r = call('HMGET', jk, 's', 'wv', 'wn', 'pr', 'g', 'ct')
  if r[1] == 'scheduled' and r[2] == key and r[3] then
    local sk = steps_of(id, r[6])
    call('HSET', sk, 'ct', r[6] or '', 'w:' .. r[3], ARGV[3])
    call('HSET', jk, 'xk', 1, 's', 'queued')
    call('HDEL', jk, 'wv', 'wn', 'due')
    call('ZREM', K_SCHED, id)
    push_ready(id, r[4], false, r[5])
    emit_job('promoted', id, jk, 'signal')
    woken = woken + 1
  end
end
if woken > 0 then wake() end
return {woken, call('SCARD', ek)}
