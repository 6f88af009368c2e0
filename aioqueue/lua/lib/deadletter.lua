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

local STATES = {waiting = true, scheduled = true, queued = true, active = true,
  completed = true, failed = true, cancelled = true}

-- a record whose state was garbled is kept as a dead letter with the reason, never dropped
local function dead_if_corrupt(id, jk, state, now, dead_ttl)
  if state and not STATES[state] then
    to_dead(id, jk, now, cjson.encode({type = 'CorruptState',
      message = 'the job record had an unknown state: ' .. tostring(state)}), dead_ttl)
    return true
  end
  return false
end
