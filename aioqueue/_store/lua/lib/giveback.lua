--[[ giveback: hand an active job back to the queue before its run ends, fenced by its lease
  token: a release (pull API, a worker shutting down, release.lua) or a durable wait parking
  the job (wait.lua). Its step results and log stay with it.
  Needs: core, events (emit_job), lanes (release_slot), limiters (LIM.limits_done),
  deadletter (to_dead), history (end_attempt), acks (requeue). ]]

-- give back the active job id (record jk, r: its fields s l pr g a m wk rl o as release.lua
-- reads them; its named limits' concurrency slots are freed) leased with token tok: runnable after delay ms (0: now, ahead of its priority level),
-- its attempt refunded or not; released without a refund on its last attempt, it is
-- dead-lettered (AttemptsExhausted). Its step results and log stay (release.lua, wait.lua)
local function release_job(id, jk, r, tok, delay, refund, now, dead_ttl)
  local a, m = REC.attempts(r[5], r[6])
  end_attempt(jk, r[5], r[7], 'released', nil, now)
  call('ZREM', K_ACTIVE, id)
  unhold(r[7], id)
  call('HSET', jk, 'rl', tok)
  release_slot(r[4])
  if r[9] then LIM.limits_done(r[9], jk) end
  if refund then
    a = math.max(a - 1, 0)
    call('HSET', jk, 'a', a)
  end
  if a >= m then
    -- released without a refund on its last attempt: no attempt is left to run it
    to_dead(id, jk, now, cjson.encode({type = 'AttemptsExhausted',
      message = 'released on its last attempt (' .. a .. ' of ' .. m .. ')'}), dead_ttl)
    call('HINCRBY', K_STATS, 'failed', 1)
  else
    requeue(id, jk, delay, now, r[3], r[4], true)
    emit_job('released', id, jk, nil, delay > 0 and now + delay or nil)
  end
end
