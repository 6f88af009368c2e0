--[[ watch: read a job's outcome, or register as a waiter for it, in one atomic step, so a
  completion between "look" and "wait" cannot be missed.
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] id   ARGV[3] register a waiter (1) or only look (0)
  ARGV[4] 'job' (default) or 'batch': what the id names
  Returns {state, result, error}; state '' when there is no such job. When the job has not
  finished and ARGV[3] is 1, the job is marked as awaited: whichever script finishes it then
  publishes its id on the channel base.."done". ]]
local jk = job_key(ARGV[2])
if ARGV[4] == 'batch' then jk = batch_key(ARGV[2]) end
local r = call('HMGET', jk, 's', 'r', 'e')
if not r[1] then return {'', '', ''} end
local s = r[1]
if s ~= 'completed' and s ~= 'failed' and s ~= 'cancelled' and ARGV[3] == '1' then
  -- the finishing script publishes the id ('batch:'..id for a batch) on base.."done"
  call('HSET', jk, 'w', 1)
end
return {s, r[2] or '', r[3] or ''}
