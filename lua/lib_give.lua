-- redcount: each algorithm's give-back, in its own terms (the lib_*.lua headers say what
-- that is), shared by quota_refund.lua (an admin refund) and the reservation scripts; apart
-- from the algorithms' files so that a take or a decision, which never gives back, does not
-- define them on every call. Each reads and checks first (or takes `q`, the quota as its
-- eval read it, kept current by q.add), and returns the units it would give and the function
-- that writes them.
-- (Runs after prelude.lua and lib_fixed.lua, lib_sliding.lua, lib_bucket.lua, lib_gcra.lua.)

-- Up to `units` back, from the window that ends at `ends` (ms since the epoch, as PEXPIRETIME
-- tells a running window's end; nil: the window running now) while that window runs, never
-- below 0. Reads only; returns the units given and the function that writes them.
local function fixed_give(p, key, ovr, units, ends, clock, q)
  q = q or fixed_eval(p, key, ovr, clock)
  local n = 0
  if not ends or (not q.fresh and redis.call('PEXPIRETIME', key) == ends) then
    n = math.min(units, q.count())
  end
  return n, function() if n > 0 then q.add(-n) end end
end

-- Most entries one call's gives rewrite, over all its parts, from a reservation's entry to
-- the newest (each later total moves: a removal and an insertion each, about 2 µs of Redis
-- time); an admin refund takes units off at most the newest 500 calls (one range removal).
local sliding_rewrites, SLIDING_NEWEST = 32, 500

-- Up to `units` back, read at server time (`clock()`, in µs); writes nothing. With `tag` (a
-- reservation's id) and `at` (its entry's time), off that entry while it is in the window and
-- the entries logged from it on are within what is left of the call's 32 rewrites (else
-- nothing: its units leave the window with it); without, off the newest logged calls (a call partly given back keeps the
-- rest of its cost), at most SLIDING_NEWEST of them. A log still holding the earlier layout
-- gives nothing back. Returns the units given and the function that writes them.
local function sliding_give(p, key, units, at, tag, clock)
  local none = function() end
  local floor = math.floor(clock() / 1000) - p.window
  if tag then
    if at <= floor then return 0, none end
    local from = redis.call('ZRANGEBYSCORE', key, s(at), '+inf', 'WITHSCORES', 'LIMIT', 0, sliding_rewrites + 1)
    if #from > 2 * sliding_rewrites then return 0, none end
    local mark = ':' .. tag
    local i = 1
    while i <= #from and string.sub(from[i], -#mark) ~= mark do i = i + 2 end
    if i > #from then return 0, none end
    local total, c = sliding_entry(from[i])
    if not total then return 0, none end
    local n = math.min(units, c)
    local gone, put = {from[i]}, {}
    if n < c then put = {from[i + 1], sliding_member(total - n, c - n, mark)} end
    -- Every later entry's running total drops by n; it keeps its time, cost and tag.
    for j = i + 2, #from, 2 do
      local t, cj = sliding_entry(from[j])
      if not t then return 0, none end
      gone[#gone + 1] = from[j]
      put[#put + 1] = from[j + 1]
      put[#put + 1] = sliding_member(t - n, cj, string.match(from[j], '^c%d+:%d+(.*)$'))
    end
    return n, function()
      sliding_rewrites = sliding_rewrites - #gone
      redis.call('ZREM', key, unpack(gone))
      if #put > 0 then redis.call('ZADD', key, unpack(put)) end
    end
  end
  -- The newest calls: the running totals (lib_sliding.lua) find the first entry to change by
  -- a binary search (O(log n)); the entries after it go in one ZREMRANGEBYRANK, it keeps
  -- what was not given back (untagged: a reservation's settle then finds no entry of its
  -- own, and gives nothing twice), and the totals of the older entries stay true.
  local expired = redis.call('ZCOUNT', key, '-inf', s(floor))
  local size = redis.call('ZCARD', key)
  local last_total = size > expired and sliding_entry(redis.call('ZRANGE', key, -1, -1)[1])
  local first_total, first_cost = nil, nil
  if last_total then first_total, first_cost = sliding_entry(redis.call('ZRANGE', key, expired, expired)[1]) end
  local oldest = math.max(expired, size - SLIDING_NEWEST)
  if first_total and oldest > expired then
    first_total, first_cost = sliding_entry(redis.call('ZRANGE', key, oldest, oldest)[1])
  end
  if not first_total then return 0, none end
  local n = math.min(units, last_total - (first_total - first_cost))
  local target = last_total - n -- the running total after the give
  -- The first live entry whose total passes the target (the last one does: n > 0).
  local lo, hi = oldest, size - 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local total = sliding_entry(redis.call('ZRANGE', key, mid, mid)[1])
    if not total then return 0, none end
    if total > target then hi = mid else lo = mid + 1 end
  end
  if n <= 0 then return 0, none end
  local at_lo = redis.call('ZRANGE', key, lo, lo, 'WITHSCORES')
  local total, c = sliding_entry(at_lo[1])
  local keep = c - (total - target)
  return n, function()
    redis.call('ZREMRANGEBYRANK', key, lo, -1)
    if keep > 0 then redis.call('ZADD', key, at_lo[2], sliding_member(target, keep, '')) end
  end
end

-- Up to `units` back into the bucket (the refills due first), never above its capacity.
-- With `since` (a reservation's: the bucket's last refill step, `ts`, right after its take),
-- less what the refill steps since then added: the bucket that never held those units was
-- at most that many short of this one at each step, and the steps already filled the rest
-- (giving it back would bank units past the capacity). Reads only; returns the units given
-- and the function that writes them.
local function bucket_give(p, key, ovr, units, clock, q, since)
  q = q or bucket_eval(p, key, ovr, clock)
  local most = units
  if since then
    local steps = math.floor((math.floor(clock() / 1000) - since) / p.step)
    most = units - math.max(0, steps) * p.refill
  end
  local n = math.max(0, math.min(most, q.count()))
  return n, function() if n > 0 then q.add(-n) end end
end

-- Up to `units` back (the TAT moved back by whole units, never before now). With `since` (a
-- reservation's: its server time, µs), no more than the whole units of their span left
-- after the time since then (the quota that never held them was at most that far behind
-- this one: the time elapsed already gave the rest back; whole units, so that a unit given
-- back is a unit the quota no longer counts). Reads only; returns the units given and the
-- function that writes them.
-- With `stamp` (a reservation's: gcra_stamp of the policy it was taken under), nothing back
-- once the rate or period has changed: its units were spans of the old emission interval, and
-- moving the TAT back by the new one could give back more time than they took.
local function gcra_stamp(p) return ':' .. s(p.rate) .. ':' .. s(p.period) end
local function gcra_give(p, key, ovr, units, clock, q, since, stamp)
  q = q or gcra_eval(p, key, ovr, clock)
  local most = units
  if stamp and stamp ~= '' and stamp ~= gcra_stamp(p) then
    most = 0
  elseif since then
    local T = p.period * 1000 -- one unit's span, in 1/rate µs (lib_gcra.lua)
    local left = units * T - math.max(0, clock() - since) * p.rate
    most = left > 0 and floor_div(left, T) or 0
  end
  local n = math.max(0, math.min(most, q.count()))
  return n, function() if n > 0 then q.add(-n) end end
end
