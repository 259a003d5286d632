-- redcount bench: the floor of a fixed-window take on the server's clock, for the Redis-time
-- table beside @upstash/ratelimit. The three calls lib_fixed.lua makes in a running window,
-- and nothing else: no argument checks, no override, no replies to choose. A quota take that
-- reads the server's clock, honours an override and writes nothing when it denies cannot
-- cost less than this; the peer's script makes two calls (GET, INCRBY).
-- KEYS[1]  a counter (an integer, set with an expiry before the measurement)
-- KEYS[2]  a key that does not exist (where an override would be)
-- ARGV[1]  units to add
-- Reply: {1, used}
local st = redis.call('MGET', KEYS[1], KEYS[2])
local ttl = redis.call('PTTL', KEYS[1])
redis.call('INCRBY', KEYS[1], ARGV[1])
return {1, tonumber(st[1]) + 1, ttl}
