--[[ complete_claim: finish active jobs and lease new ones in one round trip (what a busy
  worker does between two batches); the same as complete.lua then claim.lua.
  KEYS[1..13] the shared transition keys (see lib/core)
  ARGV[1] key base   ARGV[2] n to claim (>= 0; at most MAX_ACKS_PER_CALL are leased)
  ARGV[3] lease_ms   ARGV[4] dead_ttl_ms
  ARGV[5] worker id ('' = none)   ARGV[6] parking ms   ARGV[7] nonce   ARGV[8] started
  ARGV[9] free (see claim.lua)
  ARGV[10] m, the number of jobs to complete (at most MAX_ACKS_PER_CALL)   then m groups of 4
  values as in complete.lua
  Returns {claim reply as in claim.lua..., then m completion codes}: the last m values are the
  completion codes; the claim reply comes first ]]
local m = tonumber(ARGV[10])
check_count(m, MAX_ACKS_PER_CALL)
local now = now_ms()
local codes = do_complete(11, m, now)
-- it leases at most MAX_ACKS_PER_CALL jobs too (the two halves together bound its work)
local n = math.min(tonumber(ARGV[2]), MAX_ACKS_PER_CALL)
local out = claim_for(ARGV[5], n, tonumber(ARGV[3]), tonumber(ARGV[4]),
  tonumber(ARGV[6]), now, ARGV[7], ARGV[8], ARGV[9])
for _, c in ipairs(codes) do out[#out + 1] = c end
return out
