--[[ parking: an idle worker's fast path, the worker's side. A worker whose claim found too
  little registers in base.."idle" (ZSET wid -> end of the registration) with what it can take
  in base.."idlew" (HASH wid -> "want lease_ms dead_ttl_ms nonce", the nonce of the tokens of
  the jobs handed to it); it then blocks on its hand list
  base.."hand:"..wid and the wake list at once. Its next claim (claim_for) takes back its
  registration and whatever was handed to it meanwhile (see handoff). A worker that dies
  parked holds what it was handed until it is buried (see lib/workers) or the leases run out
  (recover brings the jobs back), and its registration ends by itself (reap drops it).
  Needs: core. ]]

local K_IDLE, K_IDLEW = BASE .. 'idle', BASE .. 'idlew'

local function hand_key(wid) return BASE .. 'hand:' .. wid end

-- (re)register a worker as parked until the server time `ends` (nil: its registration keeps
-- the end it has), able to take want more jobs on these terms
local function park(wid, ends, want, lease, dead_ttl, nonce)
  if ends then call('ZADD', K_IDLE, ends, wid) end
  call('HSET', K_IDLEW, wid, want .. ' ' .. lease .. ' ' .. dead_ttl .. ' ' .. nonce)
end

-- drop the registrations of these workers
local function unregister(...)
  call('ZREM', K_IDLE, ...)
  call('HDEL', K_IDLEW, ...)
end

-- a worker's claim: take back its own registration and the jobs handed to it meanwhile
-- (appended to out); returns how many jobs that was
local function unpark(wid, out)
  unregister(wid)
  local hk = hand_key(wid)
  local held = call('LRANGE', hk, 0, -1)
  if #held == 0 then return 0 end
  if #held % CLAIMED_JOB_VALUES ~= 0 then
    -- not what enqueue handed over: set it aside; the leases in it run out and recover
    -- brings their jobs back
    set_aside(hk, 'not whole leases')
    return 0
  end
  call('DEL', hk)
  for _, v in ipairs(held) do out[#out + 1] = v end
  return #held / CLAIMED_JOB_VALUES
end
