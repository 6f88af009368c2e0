--[[ promote: make scheduled jobs runnable now (an operator's "run it now"): each id that is
  still scheduled leaves the scheduled ZSET and joins the back of its lane, its attempts
  untouched; anything else is skipped.
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2..] job ids (at most MAX_JOBS_PER_CALL)
  Returns {promoted, skipped} ]]
check_count(#ARGV - 1)
local done, skipped = 0, 0
for i = 2, #ARGV do
  local id = ARGV[i]
  local jk = job_key(id)
  local r = call('HMGET', jk, 's', 'pr', 'g')
  if r[1] == 'scheduled' then
    call('ZREM', K_SCHED, id)
    call('HDEL', jk, 'due')
    call('HSET', jk, 's', 'queued')
    push_ready(id, r[2], false, r[3])
    emit_job('promoted', id, jk)
    done = done + 1
  else
    skipped = skipped + 1
  end
end
if done > 0 then wake() end
return {done, skipped}
