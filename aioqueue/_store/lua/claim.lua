--[[ claim: lease up to n runnable jobs. Lanes (the default lane and each group) are served
  round-robin, one job per turn (a lane alone in the ring gives all it can at once); within a
  lane, higher priority first and FIFO within a priority. Groups' concurrency limits, rate
  limits (per queue and per group) and pauses (of the queue or a group) are applied here.
  Before taking jobs it hands back expired leases and promotes due delayed jobs, so one call
  is all a consumer needs; it leaves a wake token when runnable jobs remain for others.
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] n (>= 0)   ARGV[3] lease_ms   ARGV[4] dead_ttl_ms
  ARGV[5] worker id ('' = none)   ARGV[6] parking ms: with a worker id, the worker first takes
  back the jobs handed to it while parked (they count towards n) and, when fewer than n jobs
  were leased and ARGV[6] > 0, parks for that long (see lib/parking)
  ARGV[7] nonce: random (hex), part of every lease token this claim makes
  ARGV[8] started, ARGV[9] free: a registered worker's report ('' none, see lib/workers): it
  has started (or given up) its first `started` leases, and starts the next `free` jobs it gets
  at once, after the jobs of the claims it sent before this one and has no reply to yet (when
  the server has counted all of those started: see claim_for in lib/leasing)
  Returns {now_ms, next_wake_ms, id_1, token_1, attempt_1, task_1, payload_1, options_1,
  max_attempts_1, ...}: 7 values per leased job (jobs handed over while parked first);
  next_wake_ms (-1: nothing pending) is set only when fewer than n jobs were leased. ]]
return claim_for(ARGV[5], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]),
  tonumber(ARGV[6]), now_ms(), ARGV[7], ARGV[8], ARGV[9])
