-- redcount: the fixed-window take's fast path, placed before prelude.lua (script.rs). A Redis
-- script runs its whole text on every call, so every helper the prelude and the libraries
-- define is a closure made, and later collected, per call: that, the per-call tables and the
-- argument checks made the take cost more than twice @upstash/ratelimit's script in Redis
-- time (measured with callgrind, BENCHMARKS.md). This block answers the common call, a take
-- in a running window without an idempotency key, with the same three Redis calls and the
-- same reply and writes as the full path below (lib_fixed.lua: fixed_eval), and only what it
-- is sure of: any argument, state or clock it does not recognise falls through, unanswered
-- and with nothing written, to the full path, which checks, names and decides it.
-- Its argument check is stricter than the prelude's int (no sign, no leading zero, which
-- INCRBY would refuse), so it accepts a subset of what the full path accepts.
if #KEYS == 2 and ARGV[4] == '0'
  and string.find(ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3], '^[1-9]%d* [1-9]%d* [1-9]%d*$') then
  local limit, window, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
  if limit <= 1000000000 and window <= 1000000000000 and cost <= 1000000000 then
    local key = KEYS[1]
    local st = redis.call('MGET', key, KEYS[2])
    local used = tonumber(st[1])
    if st[2] then -- the subject's override, as prelude.lua's override_value reads it
      local o = tonumber(st[2])
      if o and o >= 1 and o <= 1000000000 and o % 1 == 0 then limit = o end
    end
    -- A count this script wrote, in a window with time left that is not longer than this
    -- policy's window; anything else (no state, the older layout, the window ending now,
    -- a tampered value) is the full path's.
    if used and used >= 0 and used % 1 == 0 then
      local reset = redis.call('PTTL', key)
      if reset > 0 and reset <= window then
        if used + cost <= limit then
          redis.call('INCRBY', key, ARGV[3]) -- the key keeps its expiry
          return {1, limit, limit - used - cost, reset, 0}
        end
        return {0, limit, limit > used and limit - used or 0, reset, reset}
      end
    end
  end
end
