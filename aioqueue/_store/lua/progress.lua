--[[ progress: record a running job's progress (any JSON value), and its event.
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] job id   ARGV[3] progress (JSON)
  Returns 1, or 0 when there is no such job (nothing is written) ]]
local jk = job_key(ARGV[2])
if call('EXISTS', jk) == 0 then return 0 end
call('HSET', jk, 'pg', ARGV[3])
emit_job('progress', ARGV[2], jk)
return 1
