--[[ deadletter: a job that cannot run again is kept in the dead-letter store with its reason
  (to_dead); so is one whose record was garbled (dead_if_corrupt) and a queued one whose id a
  consumer could not read (dead_if_garbled_id). Either tells whoever awaits
  the job, and its batch.
  Needs: core, events (emit_job), batches (batch_outcome). ]]

-- move a job to the dead-letter store with its reason
local function to_dead(id, jk, now, err, dead_ttl)
  local r = call('HMGET', jk, 'uk', 'xk')
  unlock(id, r[1])
  call('HSET', jk, 's', 'failed', 'e', err, 'f', now)
  call('ZADD', K_DEAD, now, id)
  emit_job('failed', id, jk, err)
  if dead_ttl > 0 then
    call('PEXPIRE', jk, dead_ttl)
    follow_record(id, r[2], dead_ttl)
  end
  announce(jk, id)
  batch_outcome(id, jk, false, err, now)
end

-- a record whose state was garbled (none of the states a job can have) is kept as a dead
-- letter with the reason, never dropped; returns true if it was
local function dead_if_corrupt(id, jk, state, now, dead_ttl)
  if not state or state == 'queued' or state == 'active' or state == 'scheduled'
    or state == 'waiting' or state == 'completed' or state == 'failed' or state == 'cancelled' then
    return false
  end
  to_dead(id, jk, now, cjson.encode({type = 'CorruptState',
    message = 'the job record had an unknown state: ' .. tostring(state)}), dead_ttl)
  return true
end

-- a queued job whose id is not UTF-8 (written into a lane by something else than enqueue)
-- cannot be handed to a consumer, which could not name it back: it is kept as a dead letter
-- (Garbled) instead, and its neighbours in the claim go on; returns true if it was
local function dead_if_garbled_id(id, jk, state, now, dead_ttl)
  if state ~= 'queued' or utf8_ok(id) then return false end
  to_dead(id, jk, now, cjson.encode({type = 'Garbled',
    message = 'the job id is not UTF-8'}), dead_ttl)
  return true
end
