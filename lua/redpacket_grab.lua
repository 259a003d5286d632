-- redcount: grab one share of a red packet, at most once per user.
-- KEYS[1..4]  meta, shares, grabs, log (see redpacket_create.lua)
-- ARGV[1]     user id
-- Reply: {code, amount, index, remaining}
--   code 1 = won now, 2 = this user had already won (the same grab again: retries are
--   idempotent), 0 = empty (no share left), -1 = unknown or expired packet.
--   index = the share's position in grab order (1-based); remaining = shares left.
-- (Runs after prelude.lua: int, s, idempotency.)
if #KEYS ~= 4 or #ARGV ~= 1 then
  return misshapen()
end
local user = id('user', ARGV[1])
local meta = redis.call('HMGET', KEYS[1], 'expires_ms', 'grabbed_n', 'count', 'grabbed_sum')
local exp = meta[1]
if not exp then return {-1, 0, 0, 0} end
local prev = redis.call('HGET', KEYS[3], user)
if prev then
  local amount, index = string.match(prev, '^(%d+):(%d+)$')
  amount, index = stored(amount), stored(index)
  if not amount or amount < 1 or not index or index < 1 then
    return tampered('the red packet')
  end
  return {2, amount, index, redis.call('LLEN', KEYS[2])}
end
-- Every number this grab writes on top of (HINCRBY, PEXPIREAT) in the text redcount wrote
-- it, checked before the first write: Redis refuses " 1" or "1e0" there, after the share
-- was popped.
local grabbed_n, count = stored(meta[2] or '0'), stored(meta[3] or '0')
if not (stored(exp) and grabbed_n and count and stored(meta[4] or '0')) then
  return tampered('the red packet')
end
-- A packet whose keys Redis evicted in part (a maxmemory-policy other than noeviction)
-- could give a share to a user whose grab record is gone, or one the drain never sees: refuse
-- rather than issue. Shares left plus shares grabbed make the count, and every grab has its
-- record and its entry in the append-only grab log.
if redis.call('HLEN', KEYS[3]) ~= grabbed_n or redis.call('LLEN', KEYS[4]) ~= grabbed_n
  or redis.call('LLEN', KEYS[2]) + grabbed_n ~= count then
  return error({err = 'ERR red packet state is incomplete (were its keys evicted? redcount needs maxmemory-policy noeviction): no share issued'})
end
-- Read, checked, then popped: a share that is not a whole number of cents is refused in place.
local share = redis.call('LINDEX', KEYS[2], 0)
if not share then return {0, 0, 0, 0} end
local amount = stored(share)
if not amount or amount < 1 then
  return tampered('the red packet')
end
redis.call('LPOP', KEYS[2])

local now = now_ms()
local index = redis.call('HINCRBY', KEYS[1], 'grabbed_n', 1)
redis.call('HINCRBY', KEYS[1], 'grabbed_sum', share)
redis.call('HSET', KEYS[3], user, share .. ':' .. index)
redis.call('RPUSH', KEYS[4], user .. ':' .. share .. ':' .. index .. ':' .. string.format('%.0f', now))
redis.call('PEXPIREAT', KEYS[3], exp)
redis.call('PEXPIREAT', KEYS[4], exp)
return {1, amount, index, redis.call('LLEN', KEYS[2])}
