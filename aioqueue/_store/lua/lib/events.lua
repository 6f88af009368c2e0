--[[ events: the queue's event stream, for watching jobs move (app.events): base.."events", a
  STREAM capped at about the queue's setting of entries (XADD MAXLEN ~). An entry holds one
  event with the fields k kind, j job id ('' for a worker's events), t task, a attempt, w worker ('' none,
  or a pull-API consumer), and only where they apply r reason (a failure's error type and
  message, at most EVENT_REASON bytes; why a worker left or a job was recovered) and d due ms
  (a job enqueued for later, a retry or release after its delay); or, written by the loops of
  enqueue, claim and complete (emit_add), up to EVENTS_PER_ENTRY events of one kind of one
  call: k kind, n their number, e a JSON array of 5 strings per event in order (job id, task,
  attempt, worker, due or ''). Never payloads, arguments or results.
  Off unless the queue's settings (qconf) hold a cap in the field events (configure.lua
  'events'); a script reads it at its first event, once per call, so off costs one HGET per
  call that meets a transition. A garbled stream is set aside like any key (see call in core).
  Needs: core. ]]
local K_EVENTS = BASE .. 'events'
local EVENT_REASON = 200
-- the stream's cap, read once per call (0: off); state of one call, reset at each (a function
-- library keeps its top-level values from call to call: see _funclib.py)
local events_cap = nil -- per call

-- whether this queue writes events (read at the first call of each script run, unless the
-- script read qconf's field events with others and gives it, read, as v)
local function events_on(v)
  if events_cap == nil then
    if v == nil then v = call('HGET', K_QCONF, 'events') end
    events_cap = math.floor(num(v, 0))
    if events_cap < 1 then events_cap = 0 end
    -- a garbage cap past what Python allows (MAX_EVENTS_MAXLEN) must not make XADD fail
    if events_cap > 10000000 then events_cap = 10000000 end
  end
  return events_cap > 0
end

-- the events of one kind that a loop of this call added (emit_add), written as one entry by
-- emit_flush: EVENT_VALUES values each (id, task, attempt, worker, due)
local EVENTS_PER_ENTRY, EVENT_VALUES = 100, 5
local ev_kind, ev_vals, ev_n = nil, nil, 0 -- per call

-- write the events added since the last flush as one entry: an entry of one event has the
-- plain fields, one of n > 1 events has n and e, a JSON array of their EVENT_VALUES values in
-- turn (a stream stores each field at a cost: one field is about half the time of four per
-- event)
local function emit_flush()
  local n, v = ev_n, ev_vals
  if n == 0 then return end
  ev_n = 0
  if n == 1 then
    if v[5] ~= '' then
      call('XADD', K_EVENTS, 'MAXLEN', '~', events_cap, '*', 'k', ev_kind, 'j', v[1], 't', v[2],
        'a', v[3], 'w', v[4], 'd', v[5])
    else
      call('XADD', K_EVENTS, 'MAXLEN', '~', events_cap, '*', 'k', ev_kind, 'j', v[1], 't', v[2],
        'a', v[3], 'w', v[4])
    end
    return
  end
  for i = n * EVENT_VALUES + 1, #v do v[i] = nil end
  call('XADD', K_EVENTS, 'MAXLEN', '~', events_cap, '*', 'k', ev_kind, 'n', n,
    'e', cjson.encode(v))
end

-- add one event of a loop over many jobs (started, completed, enqueued): kept until the loop's
-- function calls emit_flush (it must, before it returns), or another kind of event is added,
-- so that a claim of 100 jobs writes one entry rather than 100 (an XADD costs about 3 us)
local function emit_add(kind, id, t, a, w, due)
  if events_cap == 0 or not events_on() then return end
  if ev_n > 0 and (ev_kind ~= kind or ev_n >= EVENTS_PER_ENTRY) then emit_flush() end
  if not ev_vals then ev_vals = {} end
  local b = ev_n * EVENT_VALUES
  ev_kind, ev_n = kind, ev_n + 1
  -- strings: cjson would write a number such as a due time in ms with an exponent
  ev_vals[b + 1], ev_vals[b + 2], ev_vals[b + 3] = id, t or '', a and tostring(a) or ''
  ev_vals[b + 4], ev_vals[b + 5] = w or '', due and string.format('%d', due) or ''
end

-- add one event (t task, a attempt, w worker, reason, due as above; nil for ''), after the
-- events added before it
local function emit(kind, id, t, a, w, reason, due)
  if events_cap == 0 or not events_on() then return end
  if ev_n > 0 then emit_flush() end
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
  -- (a record that exists without a has made no attempt: see REC.new in lib/core)
  emit(kind, id, r[1], r[2] or (r[1] and '0'), r[3], reason, due)
end
