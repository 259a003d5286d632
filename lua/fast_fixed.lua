-- redcount: the fixed-window take's fast path, placed before prelude.lua (script.rs). A Redis
-- script runs its whole text on every call, so every helper the prelude and the libraries
-- define is a closure made, and later collected, per call: that, the per-call tables and the
-- argument checks made the take cost more than twice @upstash/ratelimit's script in Redis
-- time (measured with callgrind, BENCHMARKS.md). This block answers the common calls, a take
-- in a running window and the first take of a window (no state) without an idempotency key,
-- with the same Redis calls and the same reply and writes as the full path below
-- (lib_fixed.lua: fixed_eval), and only what it is sure of: any argument, state or clock it
-- does not recognise falls through, unanswered and with nothing written, to the full path,
-- which checks, names and decides it.
-- It accepts positive integers only, in the text the full path accepts (prelude: int and
-- stored): a subset of what the full path answers.
if #KEYS == 2 and #ARGV == 4 and ARGV[4] == '0' then
  local key = KEYS[1]
  local st = redis.call('MGET', key, KEYS[2])
  local v = st[1]
  -- The three arguments and the count in one match (one call, not four): each a positive
  -- integer in the text the full path accepts (prelude: int, stored); no state reads as 1
  -- here and is told apart below. "0" is the full path's.
  if string.find(ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. (v or '1'), '^[1-9]%d* [1-9]%d* [1-9]%d* [1-9]%d*$') then
    -- (+ 0, not tonumber: one strtod each instead of two; prelude.lua: int)
    local limit, window, cost, used = ARGV[1] + 0, ARGV[2] + 0, ARGV[3] + 0, (v or '1') + 0
    if limit <= RUST.quota.MAX_LIMIT and window <= RUST.quota.MAX_WINDOW_MS and cost <= RUST.quota.MAX_LIMIT and used <= RUST.validate.MAX_SAFE then
      local o = st[2] -- the subject's override, as prelude.lua's override_value reads it
      if o and string.find(o, '^[1-9]%d*$') then
        o = o + 0
        if o <= RUST.quota.MAX_LIMIT then limit = o end
      end
      if not v then
        -- The window's first take: its end from Redis's clock (prelude: now_us), the key
        -- written with it, as fixed_eval starts a window (one MGET fewer than falling through).
        local t = redis.call('TIME')
        local now = math.floor((t[1] * 1000000 + t[2]) / 1000)
        local ends = (math.floor(now / window) + 1) * window
        local reset = ends - now
        if cost <= limit then
          redis.call('SET', key, ARGV[3], 'PXAT', string.format('%.0f', ends))
          return {1, limit, limit - cost, reset, 0}
        end
        return {0, limit, limit, reset, reset}
      end
      -- A window with time left that is not longer than this policy's window; anything
      -- else (the window ending now, a key without expiry or set under a longer window)
      -- is the full path's.
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
