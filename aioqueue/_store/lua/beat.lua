--[[ beat: a worker's heartbeat on one queue: register it (or renew its registration, see
  lib/workers), renew the leases it holds, fenced by lease tokens, and bury a worker that
  missed its deadline (so a dead worker's jobs come back within a heartbeat of its deadline,
  whatever the live workers are doing), in one call; or, with a registration period of 0,
  leave the registry (a worker that stopped).
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] worker id   ARGV[3] registration period ms: its next beat comes
  before that (0: leave)   ARGV[4] lease ms from now   ARGV[5] started: it has started (or
  given up) its first `started` leases   ARGV[6] host   ARGV[7] pid   ARGV[8] version
  ARGV[9] queues (comma-separated)   ARGV[10] concurrency   ARGV[11] start time ms
  ARGV[12] jobs done   ARGV[13] jobs failed   ARGV[14] 1 if it signs (App(signing_key=...):
  it runs only jobs signed by a key holder), else 0   ARGV[15] dead_ttl_ms (of the jobs a
  burial dead-letters; 0: keep forever)   ARGV[16] n   then n pairs: id, lease token, then
  optionally the queue's backlog and wait ms that the worker sampled (see lib/trends)
  Returns {now_ms, code_1, ..., code_n} as extend.lua: 1 renewed, -1 no such job, -2 lease
  token mismatch, -3 renewed but cancellation was requested ]]
local wid, period, lease = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
check_count(tonumber(ARGV[16]) or 0)  -- before any write
local wk = worker_key(wid)
if period <= 0 then
  -- a worker that stopped: its leases were all returned or finished (any left run out)
  call('ZREM', K_WORKERS, wid)
  call('DEL', wk)
  emit('worker_down', '', nil, nil, wid, 'stopped')
  if call('SCARD', held_key(wid)) == 0 then call('DEL', held_key(wid)) end
  return {now}
end
local started = num(ARGV[5], 0)
call('ZADD', K_WORKERS, now + period, wid)
if call('HEXISTS', wk, 'ln') == 0 then
  -- a new registration (or one that was buried): its next lease ordinals follow what it
  -- has started
  call('HSET', wk, 'ln', started, 'sn', started)
  emit('worker_up', '', nil, nil, wid)
elseif (count_of(call('HGET', wk, 'sn') or '') or -1) < started then
  -- (one that is garbage is written over)
  call('HSET', wk, 'sn', started)
end
call('HSET', wk, 'host', ARGV[6], 'pid', ARGV[7], 'ver', ARGV[8], 'queues', ARGV[9],
  'conc', ARGV[10], 'st', ARGV[11], 'beat', now, 'done', ARGV[12], 'failed', ARGV[13],
  'sg', ARGV[14])
-- the description outlives a missed deadline long enough for a live worker or reap to bury it
local keep = math.max(10 * period, 2 * lease)
call('PEXPIRE', wk, keep)
call('PEXPIRE', held_key(wid), keep)
-- after its own renewal: a worker that stalled past its deadline and beats again is not
-- buried by its own beat
bury_dead(now, tonumber(ARGV[15]), 1)
local n = tonumber(ARGV[16])
local out = {now}
renew_leases(out, lease, now, 17, n)
local backlog, wait = count_of(ARGV[17 + 2 * n]), count_of(ARGV[18 + 2 * n])
if backlog and wait then trend_sample(backlog, wait, now) end
return out
