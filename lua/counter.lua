-- redcount: bounded counter (a string key, or one field of a hash).
-- KEYS[1]  the counter key
-- ARGV[1]  hash field, or "" for a plain string key
-- ARGV[2]  delta: signed integer, |delta| <= 10^15
-- ARGV[3]  min: integer
-- ARGV[4]  max: integer >= min, or "" for no maximum
-- ARGV[5]  mode: "clamp" (apply the part of delta that stays in bounds) or "reject" (all or nothing)
-- ARGV[6]  ttl in ms (0 .. counter::MAX_TTL_MS), renewed by every write, so a counter lives
--          this long after its own last write; 0 for none. Hash storage: the hash lives this
--          long after the last write to any of its counters, and each field too where Redis
--          has per-field expiry (7.4+)
-- Reply: {value, applied, flag}; flag 0 = applied as asked, 1 = clamped, 2 = rejected.
-- Every check runs before the single write: Redis has no rollback.
-- Optional: KEYS[2] + two last ARGV make it idempotent (prelude.lua).
-- (Runs after prelude.lua: int, s, idempotency.)
local LIM = RUST.counter.MAX_VALUE -- 10^15, far below 2^53 so every sum stays exact

local key, field = KEYS[1], ARGV[1]
local delta = int('delta', ARGV[2], -LIM, LIM)
local min = int('min', ARGV[3], -LIM, LIM)
-- No maximum is the documented 10^15: every stored value stays within +-10^15.
local max = LIM
if ARGV[4] ~= '' then max = int('max', ARGV[4], min, LIM) end
local mode = ARGV[5]
if mode ~= 'clamp' and mode ~= 'reject' then
  return error({err = 'ERR redcount: mode must be clamp or reject'})
end
local ttl = int('ttl', ARGV[6], 0, RUST.counter.MAX_TTL_MS)

local replay, finish = idempotency(1, 6)
if replay then return replay end

local raw
if field == '' then raw = redis.call('GET', key) else raw = redis.call('HGET', key, field) end
local cur = 0
if raw then
  cur = stored(raw)
  if not cur then
    return error({err = 'ERR redcount: stored value is not an integer counter'})
  end
  if cur < -2 * LIM or cur > 2 * LIM then
    return error({err = 'ERR redcount: stored value out of range'})
  end
end

local want = cur + delta
local new, flag = want, 0
-- Only the direction of delta is bounded: a value already outside the bounds is never
-- pushed further out, and never jumps towards them by more than was asked.
if delta < 0 and want < min then
  new = math.max(want, math.min(cur, min))
  flag = 1
elseif delta > 0 and want > max then
  new = math.min(want, math.max(cur, max))
  flag = 1
end
if flag == 1 and mode == 'reject' then new, flag = cur, 2 end

local applied = new - cur
if applied ~= 0 then
  if field == '' then
    redis.call('INCRBY', key, s(applied))
    if ttl > 0 then redis.call('PEXPIRE', key, s(ttl)) end
  else
    redis.call('HINCRBY', key, field, s(applied))
    if ttl > 0 then
      -- The hash never ends before this field's TTL; where the field can expire on its
      -- own (HPEXPIRE, Redis 7.4+), it does.
      if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, s(ttl)) end
      pcall(redis.call, 'HPEXPIRE', key, s(ttl), 'FIELDS', 1, field)
    end
  end
end
-- Nothing applied (delta 0, or clamped or rejected at a bound) stores nothing.
return finish({new, applied, flag}, applied ~= 0)
