-- redcount: the fixed-window quota (N per window, windows aligned to the Unix epoch) as
-- functions, shared by quota_fixed.lua and decide.lua (the core prepends this file to both).
-- State: a string "<window number>:<units used in it>", expiring when its window ends; with
-- the override read by the same MGET, a take is three Redis calls (TIME, MGET, SET ... PX).

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
  local st = redis.call('MGET', key, ovr)
  local limit = override_value(st[2], p.limit, 1000000000)
  local now = math.floor(now_us / 1000)
  local w = math.floor(now / p.window)
  local used = 0
  local sw, sn = string.match(st[1] or '', '^(%d+):(%d+)$')
  if tonumber(sw) == w then used = tonumber(sn) end
  local reset = (w + 1) * p.window - now
  local q = {allowed = used + p.cost <= limit, retry = 0}
  if not q.allowed then q.retry = reset end
  function q.take()
    used = used + p.cost
    redis.call('SET', key, s(w) .. ':' .. s(used), 'PX', s(reset))
  end
  function q.reply() return {q.allowed and 1 or 0, limit, math.max(0, limit - used), reset, q.retry} end
  return q
end
