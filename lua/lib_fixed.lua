-- redcount: the fixed-window quota (N per window, windows aligned to the Unix epoch) as
-- functions, shared by quota_fixed.lua and decide.lua (the core prepends this file to both).
-- State: KEYS hash {w = window number, n = units used in it}.

-- The parameters at ARGV[a .. a+2]: limit (1 .. 10^9), window in ms (1 .. 10^12), cost
-- (1 .. 10^9; more than the limit in force is denied).
local function fixed_args(a)
  return {
    limit = int('limit', ARGV[a], 1, 1000000000),
    window = int('window', ARGV[a + 1], 1, 1000000000000),
    cost = int('cost', ARGV[a + 2], 1, 1000000000),
  }
end

-- Reads the state at server time `now_us` and decides; writes nothing. Returns a table:
-- allowed, retry (ms until a call of this cost can pass; 0 when allowed), take() to consume
-- the cost (call it only when allowed), and reply(): {allowed, limit, remaining, reset_ms,
-- retry_after_ms}, after take() when it was called.
local function fixed_eval(p, key, ovr, now_us)
  local limit = override(ovr, p.limit, 1000000000)
  local now = math.floor(now_us / 1000)
  local w = math.floor(now / p.window)
  local st = redis.call('HMGET', key, 'w', 'n')
  local used = 0
  if tonumber(st[1]) == w then used = tonumber(st[2]) or 0 end
  local reset = (w + 1) * p.window - now
  local q = {allowed = used + p.cost <= limit, retry = 0}
  if not q.allowed then q.retry = reset end
  function q.take()
    used = used + p.cost
    redis.call('HSET', key, 'w', s(w), 'n', s(used))
    redis.call('PEXPIRE', key, s(reset))
  end
  function q.reply() return {q.allowed and 1 or 0, limit, math.max(0, limit - used), reset, q.retry} end
  return q
end
