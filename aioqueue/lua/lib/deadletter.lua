--[[ deadletter: a job that cannot run again is kept in the dead-letter store with its reason
  (to_dead); so is one whose record was garbled (dead_if_corrupt). Either tells whoever awaits
  the job, and its batch.
  Needs: core, batches (batch_outcome). ]]

-- move a job to the dead-letter store with its reason
local function to_dead(id, jk, now, err, dead_ttl)
  redis.call('HSET', jk, 's', 'failed', 'e', err, 'f', now)
  redis.call('ZADD', K_DEAD, now, id)
  if dead_ttl > 0 then redis.call('PEXPIRE', jk, dead_ttl) end
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
