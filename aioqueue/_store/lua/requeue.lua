--[[ requeue: bring dead letters back to the queue with their attempts reset (an operator's
  retry). Each id that is still a dead letter (state failed) leaves the dead-letter store, loses
  its retention TTL, its error and its finish time, and joins the back of its lane; anything else
  is skipped, and a dead-letter entry whose record is gone (expired) is dropped.
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2..] job ids (at most MAX_JOBS_PER_CALL)
  Returns {requeued, skipped} ]]
check_count(#ARGV - 1)
local done, skipped = 0, 0
for i = 2, #ARGV do
  local id = ARGV[i]
  local jk = job_key(id)
  local r = call('HMGET', jk, 's', 'pr', 'g', 'xk', 't')
  if r[1] == 'failed' then
    call('ZREM', K_DEAD, id)
    call('PERSIST', jk)
    follow_record(id, r[4], -1)
    call('HDEL', jk, 'e', 'f', 'due', 'x')
    call('HSET', jk, 's', 'queued', 'a', 0)
    BL.count(r[5], 1)
    push_ready(id, r[2], false, r[3])
    emit_job('requeued', id, jk)
    done = done + 1
  else
    if not r[1] then call('ZREM', K_DEAD, id) end
    skipped = skipped + 1
  end
end
if done > 0 then
  call('HINCRBY', K_STATS, 'requeued', done)
  wake()
end
return {done, skipped}
