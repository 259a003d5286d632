-- redcount: the fixed-window quota (N per window, windows aligned to the Unix epoch) as
-- functions, shared by quota_fixed.lua, decide.lua and the reservation scripts (the core
-- prepends this file to each).
-- State: the units used in the current window, a plain integer whose key expires when the
-- window ends (PXAT, on Redis's clock). While the key exists it is this window's (Redis
-- expires keys on its own clock, frozen for a script's run), so a take in a running window
-- is three cheap calls, MGET (state and override), PTTL (the reset) and INCRBY, and reads
-- no TIME; the first take of a window reads TIME and sets the key with its end.
-- Before this layout the state was "<window number>:<used>" (SET ... PX); such a value is
-- still read, when it is of the current window, and replaced by the first take or give.
-- Units given back (lib_give.lua) come off the count of the window they were taken in, while
-- it runs; once it has ended they are back already (the next window starts at 0). Units
-- charged late (a reservation's overrun) count in the window running when they are charged.

-- The parameters at ARGV[a .. a+2]: limit (1 .. 10^9), window in ms (1 .. 10^12), cost
-- (1 .. 10^9; more than the limit in force is denied); with `nocost`, no cost (p.cost 0).
local function fixed_args(a, nocost)
  return {
    limit = int('limit', ARGV[a], 1, RUST.quota.MAX_LIMIT),
    window = int('window', ARGV[a + 1], 1, RUST.quota.MAX_WINDOW_MS),
    cost = nocost and 0 or int('cost', ARGV[a + 2], 1, RUST.quota.MAX_LIMIT),
  }
end

-- Reads the state and decides; writes nothing. `clock()` gives the server time in µs (read
-- only when a window starts). Returns a table: allowed, retry (ms until a call of this cost
-- can pass; 0 when allowed), take() to consume the cost (call it only when allowed), and
-- reply(): {allowed, limit, remaining, reset_ms, retry_after_ms}, after take() when it was
-- called. For what is not a take (lib_reserve.lua): limit (in force), most (the count's
-- bound, 10^9), count() (units used in the running window), add(n) (n more units, or -n
-- back; the caller keeps the count within 0 .. most), and fresh (no running window: its key
-- is written by the first add).
local function fixed_eval(p, key, ovr, clock)
  local st = redis.call('MGET', key, ovr)
  local limit = p.limit
  if st[2] then limit = override_value(st[2], limit, RUST.quota.MAX_LIMIT) end
  local used = stored(st[1])
  -- Not a count this file wrote (negative, or not in the text it writes: "2.5", "nan", " 1",
  -- "1e0", which INCRBY would refuse): not trusted, the window restarts.
  if used and used < 0 then used = nil end
  -- PTTL counts on the live clock: 0 when the window has just ended during this script (its
  -- key still stands on the frozen clock, so the call is still that window's).
  local reset = used and redis.call('PTTL', key)
  local ends -- set when this call starts the window: its end, in ms since the epoch
  -- No state, the layout before, a key without an expiry, or one that outlives a window (set
  -- under a longer window_ms: it cannot be this window's).
  if not reset or reset < 0 or reset > p.window then
    local now = math.floor(clock() / 1000)
    local w = math.floor(now / p.window)
    local sw, sn = string.match(st[1] or '', '^(%d+):(%d+)$')
    used = tonumber(sw) == w and tonumber(sn) or 0
    ends = (w + 1) * p.window
    reset = ends - now
  elseif reset == 0 then
    reset = 1
  end
  local q = {allowed = used + p.cost <= limit, retry = 0, limit = limit, most = RUST.quota.MAX_LIMIT, fresh = ends ~= nil}
  if not q.allowed then q.retry = reset end
  function q.count() return used end
  function q.add(n)
    used = used + n
    if ends then
      redis.call('SET', key, s(used), 'PXAT', s(ends))
      ends, q.fresh = nil, false -- the window's key stands now
    else
      redis.call('INCRBY', key, s(n)) -- the key keeps its expiry
    end
  end
  function q.take() q.add(p.cost) end
  function q.reply() return {q.allowed and 1 or 0, limit, math.max(0, limit - used), reset, q.retry} end
  return q
end
