-- redcount: reserve units of several quotas (and leases of semaphores) of one subject, all or
-- nothing, decided at one server time before anything is written, held until settle.lua
-- says what was used or the lease ends (lib_reserve.lua).
-- ARGV[1]  number of parts n (1 .. 8)
-- ARGV[2]  "1" capped (a quota part short of units gets what remains, if at least its
--          minimum), "0" all (every part gets its units, or nothing is reserved)
-- ARGV[3]  "1" to peek (report, reserve nothing, write nothing), else "0"
-- ARGV[4]  the reservation's id (1 to 64 of A-Z a-z 0-9 _ -), not in use in the subject
-- ARGV[5]  lease in ms (1 .. 10^10): the reservation and its lease parts end then, unsettled
-- ARGV[6]  how long the record is kept after the lease ends or the settlement, ms (1 .. 7 days)
-- ARGV[7..] per part, in order: its kind, then
--   fw | sw  limit, window ms, units, min units, refund    gc  rate, period ms, burst, units,
--   tb  capacity, refill, interval ms, units, min, refund      min units, refund
--   se  holder, limit (a new lease of the semaphore named by the subject, for the lease)
--   units as a take's cost (lib_*.lua: *_args); min units 1 .. units (read in capped mode);
--   refund "1" when the policy gives the units back if the lease ends unsettled, else "0".
-- KEYS     the record, then three per part (lib_reserve.lua), all in the subject's slot.
-- Reply: {allowed, denied_by, retry_after_ms, n, expires_at_ms, state, then 7 numbers per part}
--   denied_by, retry_after_ms as decide.lua's; expires_at_ms: the lease's end, server time in
--   ms since the epoch (0 when nothing was reserved); state 1 open (0 when nothing was
--   reserved; a replay tells it as it is now: 2 settled, 3 released, 4 expired, 0 forgotten);
--   a quota part: {allowed, limit, remaining, reset_ms, retry_after_ms, reserved, back}:
--     reserved: the units taken (a peek: would take; 0 when denied); back: units of this quota's expired reservations given back
--     first (lib_reserve.lua: expiry queue), before this call was decided;
--   a lease part: as decide.lua's (code 0 full, 1 new lease, 3 the holder holds a lease of
--     this semaphore already: denied until it ends).
-- Owed refunds of expired reservations are applied first; otherwise a denied reservation or a
-- peek writes nothing. Optional: one key more + two last ARGV make it idempotent (prelude.lua);
-- only a reservation that reserved is stored.

local n = int('parts', ARGV[1], 1, 8)
local capped = flag('capped', ARGV[2])
local peek = flag('peek', ARGV[3])
local rid = id('reservation', ARGV[4])
local lease = int('lease_ms', ARGV[5], 1, RUST.semaphore.MAX_LEASE_MS)
local keep = int('keep_ms', ARGV[6], 1, RUST.reservation.MAX_KEEP_MS)
local parts, a = reserve_parts(n, 7, function(kind, at)
  local p = kind.args(at + 1)
  local min = int('min_units', ARGV[at + kind.n + 2], 1, p.cost)
  local refund = flag('refund', ARGV[at + kind.n + 3])
  return {p = p, units = p.cost, min = capped and min or p.cost, refund = refund}, kind.n + 4
end, function(at)
  local holder = id('holder', ARGV[at + 1])
  return {p = {holder = holder, limit = int('limit', ARGV[at + 2], 1, RUST.semaphore.MAX_LIMIT), lease = lease}}, 3
end)
local used_keys, sha = reserve_keys(n, a - 1)

local replay, finish = idempotency(used_keys)
if replay then
  -- The reservation as it is now.
  local rec = redis.call('HMGET', KEYS[1], 's', 'e')
  local st, ends = stored(rec[1]) or 0, stored(rec[2]) or 0
  if st == 1 and ends <= math.floor(now_us() / 1000) then st = 4 end
  replay[6] = st
  return replay
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  -- Its own first word, so a client tells this conflict from bad input by code; returned,
  -- not raised (Redis adds the script's SHA and line to an error a script raises).
  return {err = 'CONFLICT redcount: reservation id is in use'}
end

local now = now_us()
local ms = math.floor(now / 1000)
local function clock() return now end -- one server time for every part
local function decide_all()
  for i = 1, n do
    local part = parts[i]
    local k = part.k
    if part.se then
      local q = lease_eval(part.p, KEYS[k], KEYS[k + 1], KEYS[k + 2], now)
      local r = q.reply()
      if r[1] == 2 then
        -- The holder holds a lease already (its own, or an open reservation's, which a
        -- settle of this one would then end): denied, until that lease ends.
        local ends = tonumber(redis.call('ZSCORE', KEYS[k], part.p.holder)) or ms
        r = {3, r[2], r[3], r[4], math.max(0, ends - ms), 0, 0}
        q = {allowed = false, retry = r[5], reply = function() return r end}
      end
      part.q = q
    else
      part.p.cost = part.units
      part.q = part.kind.eval(part.p, KEYS[k], KEYS[k + 1], clock)
    end
  end
end
decide_all() -- every part read and checked before anything is written
-- Owed refunds of this quota's expired reservations first (bounded), then decide again.
local budget, owed = RESERVE_DUE, false
for i = 1, n do
  local part = parts[i]
  part.back = 0
  if not part.se and not peek then
    part.due = reserve_due(KEYS[part.k + 2], ms, budget)
    budget = budget - #part.due
    owed = owed or #part.due > 0
  end
end
if owed then
  for i = 1, n do
    local part = parts[i]
    if part.due and #part.due > 0 then
      local k = part.k
      part.back = reserve_settle_due(part, KEYS[k], KEYS[k + 1], KEYS[k + 2], part.due, clock)
    end
  end
  decide_all()
end

local allowed, denied_by, retry = true, 0, 0
for i = 1, n do
  local part = parts[i]
  if capped and not part.se and not part.q.allowed then
    -- What remains, if it is at least the part's minimum.
    local left = math.min(part.units, part.q.reply()[3])
    if left >= part.min then
      part.p.cost = left
      part.q = part.kind.eval(part.p, KEYS[part.k], KEYS[part.k + 1], clock)
    end
  end
  if not part.q.allowed then
    if allowed then denied_by = i end
    allowed = false
    retry = math.max(retry, part.q.retry)
  end
end

local ends = ms + lease
local record = {'s', '1', 'e', s(ends), 'k', sha}
if allowed and not peek then
  for i = 1, n do
    local part = parts[i]
    local k = part.k
    if part.se then
      part.q.take()
      record[#record + 1], record[#record + 2] = 'p' .. i, 'l:' .. s(part.q.reply()[7]) .. ':' .. part.p.holder
    else
      local where = 0
      if part.tag == 'sw' then
        where = part.q.add(part.p.cost, rid)
      else
        part.q.take()
        if part.tag == 'fw' then
          where = redis.call('PEXPIRETIME', KEYS[k])
        elseif part.tag == 'tb' then
          where = stored(redis.call('HGET', KEYS[k], 'ts')) or ms -- its refill phase
        else
          where = now
        end
      end
      local stamp = reserve_stamp_of(part)
      record[#record + 1], record[#record + 2] = 'p' .. i, reserve_quota_record(part.p.cost, part.p.cost, 0, where, part.refund, stamp)
      if part.refund then
        redis.call('ZADD', KEYS[k + 2], s(ends), reserve_entry(rid, part.p.cost, where, stamp))
        reserve_keep_queue(KEYS[k + 2], part, ends)
      end
    end
  end
  redis.call('HSET', KEYS[1], unpack(record))
  redis.call('PEXPIREAT', KEYS[1], s(ends + keep))
end

local ok = allowed and not peek
local out = {allowed and 1 or 0, denied_by, retry, n, ok and ends or 0, ok and 1 or 0}
for i = 1, n do
  local part = parts[i]
  local r = part.q.reply()
  if part.se then
    for j = 1, 7 do out[#out + 1] = r[j] or 0 end
  else
    for j = 1, 5 do out[#out + 1] = r[j] end
    out[#out + 1] = (allowed and part.q.allowed) and part.p.cost or 0
    out[#out + 1] = part.back
  end
end
-- Only a reservation that reserved stores its reply (a denied one or a peek changed nothing
-- that is its own: owed refunds are earlier calls' due).
return finish(out, ok)
