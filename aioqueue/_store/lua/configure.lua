--[[ configure: change a queue's or a group's settings, and make runnable whatever the change
  unblocks (a resumed queue or group, a raised limit), waking a consumer.
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] operation   ARGV[3] group ('' for queue-wide operations)
  ARGV[4], ARGV[5] values (as the operation needs; '' clears a setting)
  Operations:
    pause / resume                 the queue (ARGV[3] '') or one group
    limit         ARGV[4] K        concurrency limit of a group, or ('' group) the default of
                                   every group without its own
    rate          ARGV[4] N ARGV[5] period ms   rate limit of a group, of the queue (group '')
    group_rate    ARGV[4] N ARGV[5] period ms   the default rate of groups without their own
    events        ARGV[4] cap      write the queue's event stream (see lib/events), keeping
                                   about the newest cap events ('' off; the stream is kept)
    max_queued    ARGV[4] N ARGV[5] wait ms   backpressure: enqueue refuses a call that would
                                   take the waiting jobs past N (see enqueue.lua); wait ms, the
                                   longest a producer waits for room ('' or 0: refuse at once)
  Returns 1, or an error for an unknown operation ]]
local op, g, v1, v2 = ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local function set_or_clear(key, field, value)
  if value == '' then call('HDEL', key, field) else call('HSET', key, field, value) end
end

-- re-examine every group that may be parked by a limit or a rate: one parked by its limit has
-- active jobs (so it is in gactive), one parked by its rate is in gwait; both sets are bounded
-- by the work in flight, never by the number of groups
local function reactivate_all()
  for _, g in ipairs(call('HKEYS', K_GACTIVE)) do activate(g) end
  local waiting = call('ZRANGE', K_GWAIT, 0, -1)
  if #waiting > 0 then
    call('DEL', K_GWAIT)
    for _, g in ipairs(waiting) do activate(g) end
  end
end

if op == 'pause' then
  if g == '' then call('HSET', K_QCONF, 'paused', 1)
  else
    call('HSET', K_GCONF, 'paused:' .. g, 1)
    call('ZREM', K_RING, g)
  end
elseif op == 'resume' then
  if g == '' then call('HDEL', K_QCONF, 'paused')
  else
    call('HDEL', K_GCONF, 'paused:' .. g)
    activate(g)
  end
elseif op == 'limit' then
  if g == '' then
    set_or_clear(K_QCONF, 'glimit', v1)
    reactivate_all()
  else
    set_or_clear(K_GCONF, 'limit:' .. g, v1)
    activate(g)
  end
elseif op == 'rate' then
  if g == '' then
    set_or_clear(K_QCONF, 'rate_n', v1)
    set_or_clear(K_QCONF, 'rate_ms', v2)
  else
    set_or_clear(K_GCONF, 'rate_n:' .. g, v1)
    set_or_clear(K_GCONF, 'rate_ms:' .. g, v2)
    call('ZREM', K_GWAIT, g)
    activate(g)
  end
elseif op == 'group_rate' then
  set_or_clear(K_QCONF, 'grate_n', v1)
  set_or_clear(K_QCONF, 'grate_ms', v2)
  reactivate_all()
elseif op == 'events' then
  set_or_clear(K_QCONF, 'events', v1)
elseif op == 'max_queued' then
  set_or_clear(K_QCONF, 'maxq', v1)
  set_or_clear(K_QCONF, 'maxq_wait', v1 == '' and '' or v2)
else
  return redis.error_reply('unknown operation ' .. tostring(op))
end
wake()
return 1
