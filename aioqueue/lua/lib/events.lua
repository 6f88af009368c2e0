--[[ events: the queue's event stream, for watching jobs move (app.events): base.."events", a
  STREAM capped at about the queue's setting (XADD MAXLEN ~), one entry per transition with
  the fields k kind, j job id ('' for a worker's events), t task, a attempt, w worker ('' none,
  or a pull-API consumer), and only where they apply r reason (a failure's error type and
  message, at most EVENT_REASON bytes; why a worker left or a job was recovered) and d due ms
  (a job enqueued for later, a retry or release after its delay). Never payloads, arguments
  or results.
  Off unless the queue's settings (qconf) hold a cap in the field events (configure.lua
  'events'); a script reads it at its first event, once per call, so off costs one HGET per
  call that meets a transition. A garbled stream is set aside like any key (see call in core).
  Needs: core. ]]
local K_EVENTS = BASE .. 'events'
local EVENT_REASON = 200
-- the stream's cap, read once per call (0: off)
local events_cap

-- whether this queue writes events (read at the first call of each script run)
local function events_on()
  if events_cap == nil then
    events_cap = math.floor(num(call('HGET', K_QCONF, 'events'), 0))
    if events_cap < 1 then events_cap = 0 end
    -- a garbage cap past what Python allows (MAX_EVENTS_MAXLEN) must not make XADD fail
    if events_cap > 10000000 then events_cap = 10000000 end
  end
  return events_cap > 0
end

-- add one event (t task, a attempt, w worker, reason, due as above; nil for '')
local function emit(kind, id, t, a, w, reason, due)
  if events_cap == 0 or not events_on() then return end
  if reason and string.byte(reason, 1) == 123 then
    -- an error's JSON: its type and message
    local ok, e = pcall(cjson.decode, reason)
    if ok and type(e) == 'table' then
      reason = tostring(e.type or 'Error') .. ': ' .. tostring(e.message or '')
    end
  end
  if reason and #reason > EVENT_REASON then reason = string.sub(reason, 1, EVENT_REASON) end
  -- r and d only where they say something: two fields fewer is a fifth less of XADD's time
  if reason or due then
    call('XADD', K_EVENTS, 'MAXLEN', '~', events_cap, '*', 'k', kind, 'j', id, 't', t or '',
      'a', a or '', 'w', w or '', 'r', reason or '', 'd', due or '')
  else
    call('XADD', K_EVENTS, 'MAXLEN', '~', events_cap, '*', 'k', kind, 'j', id, 't', t or '',
      'a', a or '', 'w', w or '')
  end
end

-- add one event of the job whose record is jk, its task, attempt and worker read from it
local function emit_job(kind, id, jk, reason, due)
  if events_cap == 0 or not events_on() then return end
  local r = call('HMGET', jk, 't', 'a', 'wk')
  emit(kind, id, r[1], r[2], r[3], reason, due)
end
