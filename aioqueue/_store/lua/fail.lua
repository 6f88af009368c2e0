--[[ fail: record a failed attempt of an active job, fenced by its lease token; retry it after
  a delay while it has attempts left, otherwise dead-letter it with its error.
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] id   ARGV[3] lease token   ARGV[4] error (JSON)
  ARGV[5] retry delay ms (-1: do not retry, dead-letter now; -2: the job was cancelled, record
  it as cancelled)   ARGV[6] dead_ttl_ms
  Returns 1 retry scheduled, 2 dead-lettered, 3 cancelled, -1 no such job, -2 lease token
  mismatch (also when this token released the job); the same code again when this token
  already failed the job (a resent ack). The attempt's end goes into the job's history (hx,
  see lib/history) ]]
local id, tok, err = ARGV[2], ARGV[3], ARGV[4]
local delay, dead_ttl = tonumber(ARGV[5]), tonumber(ARGV[6])
local jk = job_key(id)
local r = call('HMGET', jk, 's', 'l', 'a', 'm', 'pr', 'g', 'wk', 'rl', 'uk', 't', 'o')
if not r[1] then return -1 end
-- this token gave the job back (release): it cannot fail it afterwards
if r[8] == tok then return -2 end
if r[2] == tok and r[1] ~= 'active' then
  -- this lease already ended the attempt: report what it did (unless the job moved on)
  if r[1] == 'failed' then return 2 end
  if r[1] == 'cancelled' then return 3 end
  if r[1] == 'queued' or r[1] == 'scheduled' then return 1 end
  return -2
end
if r[1] ~= 'active' or r[2] ~= tok then return -2 end
local now = now_ms()
call('ZREM', K_ACTIVE, id)
unhold(r[7], id)
release_slot(r[6])
if r[11] then LIM.limits_done(r[11], jk) end
if delay == -2 then
  end_attempt(jk, r[3], r[7], 'cancelled', err, now)
  unlock(id, r[9])
  to_cancelled(id, jk, err, now, dead_ttl)
  call('HINCRBY', K_STATS, 'cancelled', 1)
  if has_ready() then wake() end
  return 3
end
local a, m = REC.attempts(r[3], r[4])
if delay >= 0 and a < m then
  end_attempt(jk, r[3], r[7], 'retried', err, now)
  call('HSET', jk, 'e', err)
  requeue(id, jk, delay, now, r[5], r[6], false)
  emit_job('retried', id, jk, err, delay > 0 and now + delay or nil)
  wake()
  call('HINCRBY', K_STATS, 'retried', 1)
  return 1
end
end_attempt(jk, r[3], r[7], 'failed', err, now)
to_dead(id, jk, now, err, dead_ttl)
call('HINCRBY', K_STATS, 'failed', 1)
tally('f', 1, now)
trend('f', {r[10] or ''}, {[r[10] or ''] = 1}, now)
if has_ready() then wake() end
return 2
