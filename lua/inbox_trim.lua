-- redcount: trim an inbox by age and length.
-- KEYS[1]  the inbox sorted set (see inbox_append.lua)
-- ARGV[1]  max age in s (1 .. 10^9): messages stamped earlier than now - max age are expired
-- ARGV[2]  max length kept (1 .. 10^6)
-- ARGV[3]  how many of the oldest messages to examine for expiry (1 .. 10^5): bounds the work
-- Reply: {deleted, newest_time}; newest_time = stamp of the newest remaining message, 0 when
-- the inbox is now empty (and deleted).
-- Expired messages are dropped from the oldest and the scan stops at the first live one,
-- then the length is capped (at most 1,000 more per call: bounded Redis time), then an
-- empty inbox is deleted.
-- Optional: KEYS[2] + two last ARGV make it idempotent (prelude.lua).
-- (Runs after prelude.lua: int, s, idempotency.)

local key = KEYS[1]
local max_age = int('max_age', ARGV[1], 1, RUST.inbox.MAX_AGE_S)
local max_len = int('max_len', ARGV[2], 1, RUST.inbox.MAX_LEN)
local scan = int('scan', ARGV[3], 1, RUST.inbox.MAX_SCAN)

local replay, finish = idempotency(1, 3)
if replay then return replay end

local function stamp(m) -- nil for a member too short to carry a stamp
  if #m < 4 then return nil end
  local a, b, c, d = string.byte(m, 1, 4)
  return a + b * 256 + c * 65536 + d * 16777216
end

local now = now_s()
local cutoff = now - max_age
local deleted = 0
local oldest = redis.call('ZRANGE', key, 0, scan - 1)
local n = 0
for i = 1, #oldest do
  local ts = stamp(oldest[i])
  if ts ~= nil and ts >= cutoff then break end
  n = i -- expired, or malformed (unreadable stamp): drop it
end
if n > 0 then
  redis.call('ZREMRANGEBYRANK', key, 0, n - 1)
  deleted = n
end
local len = redis.call('ZCARD', key)
if len > max_len then
  local drop = math.min(len - max_len, 1000)
  redis.call('ZREMRANGEBYRANK', key, 0, drop - 1)
  deleted = deleted + drop
  len = len - drop
end
if len == 0 then
  redis.call('DEL', key)
  return finish({deleted, 0}, deleted > 0)
end
local newest = redis.call('ZRANGE', key, -1, -1)
-- A trim that removed nothing stores nothing.
return finish({deleted, stamp(newest[1]) or 0}, deleted > 0)
