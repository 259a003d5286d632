-- redcount: settle, extend or release a reservation (reserve.lua; lib_reserve.lua says what
-- the record and the expiry queues hold).
-- ARGV[1]  "settle" (the units used are known: the difference comes back, or the overrun is
--          charged), "extend" (a heartbeat: a new lease, and the units used so far), or
--          "release" (cancelled: every unit not reported used comes back)
-- ARGV[2]  number of parts n, as reserved (1 .. 8)
-- ARGV[3]  the reservation's id
-- ARGV[4]  extend: the new lease in ms from now (1 .. 10^10); else "0"
-- ARGV[5]  how long the record is kept after the lease ends or the settlement, ms (1 .. 7 days)
-- ARGV[6..] per part, as reserved: its kind, then
--   fw | sw  limit, window ms · tb  capacity, refill, interval ms · gc  rate, period ms, burst
--            (the policy's parameters now), then units (settle: used in all; extend: used so
--            far; release: "0"; 0 .. 10^9) and max debt (0 .. 10^9)
--   se       nothing more (the lease it holds, released or renewed with the reservation)
-- KEYS     the record, then three per part, as reserve.lua's (a call naming other parts, or
--          the same in another order, is refused: the record keeps their keys' SHA-1).
-- Reply: {state, already, n, expires_at_ms, then 7 numbers per part}
--   state: 0 unknown (no such reservation, or forgotten: nothing done), 1 open (extended),
--     2 settled, 3 released, 4 expired (its lease ended unsettled: this call applied the
--     policy's on_expiry, the units standing or given back, and nothing else);
--   already: 1 when the reservation was settled, released or expired by an earlier call: the
--     reply is that call's, and nothing is done again;
--   expires_at_ms: its lease's end (server time, ms since the epoch);
--   a quota part: {reserved, actual, refunded, charged, uncharged, debt, back}
--     reserved: units taken at the reserve; actual: the units it is settled at (settle: the
--       units given, at least what an extend reported used; release: what an extend reported
--       used; expired: what stands); refunded: units given back now (lib_give.lua, from
--       where the reserve logged them); charged: the overrun charged now; uncharged: units used
--       beyond what stands charged, not charged (the quota would stand more than its max debt
--       above its size); debt: units the quota stands above its size after the call (repaid
--       by time); back: units of its other expired reservations given back first;
--     extend: {reserved, used so far, 0, charged now, uncharged, debt, back};
--   a lease part: {1 when the lease was released (renewed, for an extend), else 0, 0, …}.
-- Writes nothing for an unknown or finished reservation. Optional: one key more + two last
-- ARGV make it idempotent (prelude.lua).

local op = ARGV[1]
if op ~= 'settle' and op ~= 'extend' and op ~= 'release' then
  return error({err = 'ERR redcount: op must be settle, extend or release'})
end
local n = int('parts', ARGV[2], 1, 8)
local rid = id('reservation', ARGV[3])
local lease = int('lease_ms', ARGV[4], op == 'extend' and 1 or 0, op == 'extend' and RUST.semaphore.MAX_LEASE_MS or 0)
local keep = int('keep_ms', ARGV[5], 1, RUST.reservation.MAX_KEEP_MS)
local parts, a = reserve_parts(n, 6, function(kind, at)
  local p = kind.args(at + 1, true)
  local amount = int('units', ARGV[at + kind.n + 1], 0, op == 'release' and 0 or RUST.quota.MAX_LIMIT)
  local debt = int('max_debt', ARGV[at + kind.n + 2], 0, RUST.quota.MAX_LIMIT)
  return {p = p, amount = amount, debt = debt}, kind.n + 3
end, function() return {}, 1 end)
local used_keys, sha = reserve_keys(n, a - 1)

local replay, finish = idempotency(used_keys)
if replay then return replay end

local fields = {'s', 'e', 'k', 'r'}
for i = 1, n do fields[4 + i] = 'p' .. i end
local rec = redis.call('HMGET', KEYS[1], unpack(fields))
if not rec[1] then
  local out = {0, 0, n, 0}
  for _ = 1, 7 * n do out[#out + 1] = 0 end
  return out
end
local st, ends = stored(rec[1]), stored(rec[2])
if not st or st < 1 or st > 4 or not ends then return tampered('the reservation') end
if rec[3] ~= sha then
  -- Returned, not raised: Redis adds the script's SHA and line to an error a script raises.
  return {err = 'CONFLICT redcount: the reservation was made with other policy settings'}
end
for i = 1, n do parts[i].rec = reserve_read_part(rec[4 + i], parts[i].se) end
if st ~= 1 then
  -- Settled, released or expired already: that call's answer, nothing done again.
  local out = reserve_unpack(rec[4])
  if #out ~= 4 + 7 * n then return tampered('the reservation') end
  out[2] = 1
  return out
end

local now = now_us()
local ms = math.floor(now / 1000)
local function clock() return now end -- one server time for every part
-- Every part's state read and checked before anything is written.
local budget = RESERVE_DUE
for i = 1, n do
  local part = parts[i]
  local k = part.k
  if part.se then
    lease_check(KEYS[k], KEYS[k + 1])
    -- Still this reservation's lease (its fencing token, not yet over)?
    local r = part.rec
    part.mine = lease_token_of(KEYS[k + 1], r.holder) == r.token
      and (tonumber(redis.call('ZSCORE', KEYS[k], r.holder)) or 0) > ms
  else
    part.q = part.kind.eval(part.p, KEYS[k], KEYS[k + 1], clock)
    part.due = reserve_due(KEYS[k + 2], ms, budget, rid)
    budget = budget - #part.due
  end
end
-- Owed refunds of the quotas' other expired reservations first.
for i = 1, n do
  local part = parts[i]
  local k = part.k
  part.back = 0
  if not part.se and #part.due > 0 then
    part.back = reserve_settle_due(part, KEYS[k], KEYS[k + 1], KEYS[k + 2], part.due, clock)
  end
end

local expired = ms >= ends
local out, record = {}, {}
if expired or op ~= 'extend' then
  local state = expired and 4 or (op == 'settle' and 2 or 3)
  out = {state, 0, n, ends}
  for i = 1, n do
    local part = parts[i]
    local k, r, q = part.k, part.rec, part.q
    if part.se then
      -- The lease part, still this reservation's (same fencing token): released.
      local released = 0
      if not expired and part.mine then
        redis.call('ZREM', KEYS[k], r.holder)
        redis.call('HDEL', KEYS[k + 1], r.holder)
        lease_keep(KEYS[k], KEYS[k + 1], keep)
        released = 1
      end
      for _, v in ipairs({released, 0, 0, 0, 0, 0, 0}) do out[#out + 1] = v end
    else
      local owed = r.refund and math.max(0, r.reserved - r.used) or 0
      local entry = reserve_entry(rid, owed, r.where, r.stamp)
      local actual, refunded, charged, over = 0, 0, 0, math.max(0, q.count() - q.limit)
      if expired then
        -- The policy's on_expiry: the units stand, or (refund) those not reported used come
        -- back, unless another call gave them back already (its queue entry is gone).
        actual = r.charged - owed
        if owed > 0 and redis.call('ZSCORE', KEYS[k + 2], entry) then
          local apply
          refunded, apply = reserve_give(part, KEYS[k], KEYS[k + 1], owed, r.where, rid, clock, r.stamp)
          apply()
        end
      else
        actual = op == 'release' and r.used or math.max(part.amount, r.used)
        if actual < r.reserved then
          local apply
          refunded, apply = reserve_give(part, KEYS[k], KEYS[k + 1], r.reserved - actual, r.where, rid, clock, r.stamp)
          apply()
        elseif actual > r.charged then
          local apply
          charged, over, apply = reserve_charge(q, actual - r.charged, part.debt)
          apply()
        end
      end
      -- (q.add keeps q current; a sliding window's give does not go through it.)
      if refunded > 0 then over = math.max(0, q.count() - (part.tag == 'sw' and refunded or 0) - q.limit) end
      if owed > 0 then redis.call('ZREM', KEYS[k + 2], entry) end
      local uncharged = math.max(0, actual - r.charged - charged)
      for _, v in ipairs({r.reserved, actual, refunded, charged, uncharged, over, part.back}) do out[#out + 1] = v end
    end
  end
  redis.call('HSET', KEYS[1], 's', s(state), 'r', reserve_pack(out))
  redis.call('PEXPIRE', KEYS[1], s(keep))
  return finish(out)
end

-- Extend: a new lease from now, and the units used so far charged past what stands.
local ends2 = ms + lease
out = {1, 0, n, ends2}
record = {'e', s(ends2)}
for i = 1, n do
  local part = parts[i]
  local k, r, q = part.k, part.rec, part.q
  if part.se then
    local renewed = 0
    if part.mine then
      redis.call('ZADD', KEYS[k], 'XX', s(ends2), r.holder)
      lease_keep(KEYS[k], KEYS[k + 1], keep)
      renewed = 1
    end
    for _, v in ipairs({renewed, 0, 0, 0, 0, 0, 0}) do out[#out + 1] = v end
  else
    local used = math.max(part.amount, r.used)
    local charged, over = 0, math.max(0, q.count() - q.limit)
    if used > r.charged then
      local apply
      charged, over, apply = reserve_charge(q, used - r.charged, part.debt)
      apply()
    end
    if r.refund then
      local before, after = math.max(0, r.reserved - r.used), math.max(0, r.reserved - used)
      if before > 0 then redis.call('ZREM', KEYS[k + 2], reserve_entry(rid, before, r.where, r.stamp)) end
      if after > 0 then
        redis.call('ZADD', KEYS[k + 2], s(ends2), reserve_entry(rid, after, r.where, r.stamp))
        reserve_keep_queue(KEYS[k + 2], part, ends2)
      end
    end
    record[#record + 1], record[#record + 2] = 'p' .. i, reserve_quota_record(r.reserved, r.charged + charged, used, r.where, r.refund, r.stamp)
    local uncharged = math.max(0, used - r.charged - charged)
    for _, v in ipairs({r.reserved, used, 0, charged, uncharged, over, part.back}) do out[#out + 1] = v end
  end
end
redis.call('HSET', KEYS[1], unpack(record))
redis.call('PEXPIREAT', KEYS[1], s(ends2 + keep))
return finish(out)
