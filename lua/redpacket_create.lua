-- redcount: create a red packet from shares split by the caller (redcount-core).
-- KEYS[1]  meta hash {total, count, created_ms, expires_ms, grabbed_n, grabbed_sum}
-- KEYS[2]  list of ungrabbed shares (cents)
-- KEYS[3]  hash user -> "amount:index" of grabs made
-- KEYS[4]  list of grab records "user:amount:index:time_ms", in grab order
-- (all four share one hash tag, so the packet lives in one cluster slot)
-- ARGV[1]  ttl in ms (1 .. redpacket::MAX_TTL_MS, 30 days)
-- ARGV[2]  total in cents (1 .. 10^13)
-- ARGV[3..] the shares, count = #ARGV - 2 (1 .. 10000), each >= 1, summing to the total
-- KEYS[5], ARGV[#ARGV-1], ARGV[#ARGV]: optional idempotency key, its TTL and fingerprint
-- Reply: {created, expires_at_ms}; created 0 = a packet with this id exists (nothing written).
-- Optional: KEYS[5] + two last ARGV make it idempotent (prelude.lua).
-- (Runs after prelude.lua: int, s, idempotency.)

local ttl = int('ttl', ARGV[1], 1, RUST.redpacket.MAX_TTL_MS)
local total = int('total', ARGV[2], 1, RUST.split.MAX_TOTAL)
local last = #ARGV -- the last share (two idempotency arguments follow it when KEYS[5] is given)
if KEYS[5] then last = #ARGV - 2 end
local count = last - 2
if count < 1 or count > RUST.split.MAX_COUNT then
  return error({err = 'ERR redcount: count out of range'})
end
local sum = 0
for i = 3, last do sum = sum + int('share', ARGV[i], 1, total) end
if sum ~= total then
  return error({err = 'ERR redcount: shares do not sum to the total'})
end
local replay, finish = idempotency(4)
if replay then return replay end

local meta = redis.call('HGET', KEYS[1], 'expires_ms')
-- A packet of this id exists: nothing written, nothing stored (prelude: idempotency).
if meta then return {0, tonumber(meta)} end

local now = now_ms()
local exp = now + ttl
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4]) -- leftovers of an expired packet of that id
for i = 3, last, 500 do -- unpack() has a stack limit: push in chunks
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 499, last)))
end
redis.call('HSET', KEYS[1], 'total', ARGV[2], 'count', s(count), 'created_ms', s(now),
  'expires_ms', s(exp), 'grabbed_n', '0', 'grabbed_sum', '0')
redis.call('PEXPIREAT', KEYS[1], s(exp))
redis.call('PEXPIREAT', KEYS[2], s(exp))
return finish({1, exp})
