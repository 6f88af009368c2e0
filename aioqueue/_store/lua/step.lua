--[[ step: a running job's durable step (ctx.step): read the result recorded for a step name,
  or record it, fenced by the lease token like an ack, so a holder whose lease ran out (the
  job handed to another consumer) cannot write. The results live in the job's extra HASH
  base.."step:"..id (extras_of), field "s:"..name, with field "ct" the record's creation
  time: a hash whose ct is not the record's belongs to an earlier job of that id and is
  dropped before anything is read from it (I8: a step result never outlives its job).
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] job id   ARGV[3] lease token   ARGV[4] 'get' or 'put'
  ARGV[5] step name   ARGV[6] the encoded result ('put')
  Returns {1, value}: get, recorded (value); put, recorded now, or before (the value
  recorded first wins and is returned); {0, n}: get, not recorded, and the job's step hash
  holds n fields (0: nothing recorded for it at all, so a run that got 0 knows every later
  step of its own is new until it records one); {-1}: no such job; {-2}:
  lease token mismatch (the job is not active, or another consumer holds it); {-3}: put, the
  job has MAX_STEPS_PER_JOB steps recorded already ]]
local id, tok, op = ARGV[2], ARGV[3], ARGV[4]
local jk = job_key(id)
local r = call('HMGET', jk, 's', 'l', 'ct')
if not r[1] then return {-1} end
if r[1] ~= 'active' or r[2] ~= tok then return {-2} end
local sk, kept = steps_of(id, r[3])
local field = 's:' .. ARGV[5]
if kept then
  local v = call('HGET', sk, field)
  if v then return {1, v} end
end
if op ~= 'put' then return {0, kept and call('HLEN', sk) or 0} end
if call('HLEN', sk) > MAX_STEPS_PER_JOB then return {-3} end
call('HSET', sk, 'ct', r[3] or '', field, ARGV[6])
call('HSET', jk, 'xk', 1)
return {1, ARGV[6]}
