--[[ limit: code holding named limits (`async with app.limit(...)`, see lib/limiters).
  KEYS[1..13] the shared transition keys of the queue whose slot the limits live in
  ARGV[1] key base   ARGV[2] 'acquire' or 'release'   ARGV[3] the limits, as a job's options
  carry them ({"lim": ...})   ARGV[4] the holder's id (random)   ARGV[5] (acquire) ms the
  concurrency slots are held at most (then counted free)
  Returns, for acquire: 0 admitted (charged), else ms to wait before trying again (by the
  rate: until the next admission; by concurrency: a short re-check). For release: 0.
  Limits that cannot be read are an error. ]]
local now = now_ms()
local who = 'code:' .. ARGV[4]
if ARGV[2] == 'release' then
  LIM.limits_done(ARGV[3], who)
  return 0
end
local lims = LIM.job_limits(ARGV[3], {})
if not lims then error('aioqueue: limits cannot be read', 0) end
for _, l in ipairs(lims) do
  local at, why = LIM.closed_until(l, now)
  if why == 'conc' then return 25 end
  if at then return math.max(1, math.ceil(at - now)) end
end
LIM.limits_charge(lims, who, now + tonumber(ARGV[5]), now)
return 0
