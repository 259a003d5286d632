-- redcount: reservations as functions shared by reserve.lua and settle.lua (after prelude.lua
-- and every other lib_*.lua but lib_take.lua). A reservation holds units of quotas (and
-- leases of semaphores) of one subject from its reserve until it is settled, released, or
-- its lease ends.
-- KEYS[1] is its record; then per part, in order, three keys in the subject's slot: a
-- quota's state, its override and its expiry queue (<state>:rx), or a semaphore's set,
-- tokens and override.
-- The record (hash): s state (1 open, 2 settled, 3 released, 4 expired), e lease end (ms,
--   server time), k SHA-1 of the parts' keys (a later call names the same parts or is
--   refused), r the final reply (numbers, comma-separated, replayed to a second settle), and
--   per part i, p<i>: "q:<reserved>:<charged>:<used>:<where>:<refund>" (units taken at the
--   reserve; charged in all, the reserve's and the overruns an extend charged; the most an
--   extend reported used; where the reserved units are logged: a fixed window's end, a
--   sliding entry's time, a bucket's last refill step (ms) after the take, or the reserve's
--   server time (µs) for GCRA (lib_give.lua); 1 when the policy gives the units back if
--   the lease ends unsettled) or "l:<token>:<holder>" (the lease's fencing token and holder).
-- An expiry queue (sorted set, score = lease end in ms): "<id>:<units>:<where>" for each open
--   reservation of that quota whose policy gives <units> back if its lease ends unsettled. A
--   later call of the scripts with that quota among its parts gives them back (RESERVE_DUE at
--   most per call), then drops the entry; a policy that charges on expiry needs no entry:
--   its units stand, and its leases end with the reservation's.

-- Most due expiry entries one call gives back, over all its parts.
local RESERVE_DUE = 8

-- The quota kinds, by the tag the core sends, with the number of their parameters.
local reserve_kinds = {
  fw = {args = fixed_args, eval = fixed_eval, n = 2},
  sw = {args = sliding_args, eval = sliding_eval, n = 2},
  tb = {args = bucket_args, eval = bucket_eval, n = 3},
  gc = {args = gcra_args, eval = gcra_eval, n = 3},
}

-- The n parts from ARGV[a] on, each its kind's tag then its arguments: `quota(kind, at)` reads
-- a quota part's (its tag at ARGV[at]), `lease(at)` a semaphore's; each returns the part and
-- how many arguments it took, the tag's included. Returns the parts and the index past them.
local function reserve_parts(n, a, quota, lease)
  local parts = {}
  for i = 1, n do
    local tag = ARGV[a]
    local kind = reserve_kinds[tag]
    local part, took
    if kind then
      part, took = quota(kind, a)
      part.tag, part.kind = tag, kind
    elseif tag == 'se' then
      part, took = lease(a)
      part.se = true
    else
      return error({err = 'ERR redcount: a part kind must be fw, sw, tb, gc or se'})
    end
    part.k = 2 + 3 * (i - 1)
    parts[i] = part
    a = a + took
  end
  return parts, a
end

-- Every part's keys distinct and present, and nothing but them, the record's and an
-- idempotency key (with its two arguments after `nargs`). Returns the number of keys before
-- the idempotency key and the SHA-1 of the parts' keys.
local function reserve_keys(n, nargs)
  local used = 1 + 3 * n
  local seen, list = {}, {}
  for i = 1, used do
    if not KEYS[i] or seen[KEYS[i]] then
      return error({err = 'ERR redcount: every part needs its own keys'})
    end
    seen[KEYS[i]] = true
    if i > 1 then list[#list + 1] = KEYS[i] end
  end
  local extra = #KEYS - used
  if (extra ~= 0 and extra ~= 1) or #ARGV ~= nargs + 2 * extra then return misshapen() end
  return used, redis.sha1hex(table.concat(list, '\n'))
end

-- A part's record ("q:…" or "l:…", see above), and back: refused when redcount did not write it.
-- A GCRA part's ends with its stamp (gcra_stamp: the rate and period it was taken at); a
-- record written before stamps has none.
local function reserve_quota_record(r, charged, used, where, refund, stamp)
  return 'q:' .. s(r) .. ':' .. s(charged) .. ':' .. s(used) .. ':' .. s(where) .. ':' .. (refund and '1' or '0')
    .. stamp
end
-- A stamp as stored ('' or ':rate:period'), nil when it is not one.
local function reserve_stamp(t)
  if t == '' or string.match(t, '^:%d+:%d+$') then return t end
end
local function reserve_read_part(v, lease)
  if lease then
    local token, holder = string.match(v or '', '^l:(%d+):([%w_%-]+)$')
    token = stored(token)
    if not token or #holder > 64 then return tampered('the reservation') end
    return {token = token, holder = holder}
  end
  local r, c, u, w, x, t = string.match(v or '', '^q:(%d+):(%d+):(%d+):(%d+):([01])(.*)$')
  r, c, u, w, t = stored(r), stored(c), stored(u), stored(w), reserve_stamp(t or '-')
  if not (r and c and u and w and t) then return tampered('the reservation') end
  return {reserved = r, charged = c, used = u, where = w, refund = x == '1', stamp = t}
end

-- An expiry queue's entry, and back (refused when redcount did not write it).
local function reserve_entry(rid, units, where, stamp)
  return rid .. ':' .. s(units) .. ':' .. s(where) .. stamp
end
local function reserve_read_entry(m)
  local rid, units, where, t = string.match(m, '^([%w_%-]+):(%d+):(%d+)(.*)$')
  units, where, t = stored(units), stored(where), reserve_stamp(t or '-')
  if not rid or #rid > 64 or not units or not where or not t then return tampered('an expiry queue') end
  return rid, units, where, t
end

-- The entries of an expiry queue due at `ms` (their lease ended), at most `most`, `own`
-- (the reservation being settled, which settles its own) left out; read and checked only.
local function reserve_due(rx, ms, most, own)
  local out = {}
  if most <= 0 then return out end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', rx, '-inf', s(ms), 'LIMIT', 0, most + 1)) do
    local rid, units, where, stamp = reserve_read_entry(m)
    if rid ~= own and #out < most then
      out[#out + 1] = {m = m, rid = rid, units = units, where = where, stamp = stamp}
    end
  end
  return out
end

-- Up to `units` of a quota part back, in its algorithm's own terms (lib_give.lua), from
-- where the reservation `rid` logged them; part.q is the quota as read (a sliding window's
-- give reads its log itself: part.q is then out of date). Reads only; returns the units and
-- the writer.
local function reserve_give(part, key, ovr, units, where, rid, clock, stamp)
  if part.tag == 'fw' then return fixed_give(part.p, key, ovr, units, where, clock, part.q) end
  if part.tag == 'sw' then return sliding_give(part.p, key, units, where, rid, clock) end
  if part.tag == 'tb' then return bucket_give(part.p, key, ovr, units, clock, part.q, where) end
  return gcra_give(part.p, key, ovr, units, clock, part.q, where, stamp)
end
-- A part's stamp when its units are taken: a GCRA part's rate and period.
local function reserve_stamp_of(part)
  return part.tag == 'gc' and gcra_stamp(part.p) or ''
end

-- Gives back what each due entry (reserve_due) held, and drops it; returns the units back.
-- A sliding part is read again after (part.q then tells its log as it is).
local function reserve_settle_due(part, key, ovr, rx, due, clock)
  local back = 0
  for _, d in ipairs(due) do
    local n, apply = reserve_give(part, key, ovr, d.units, d.where, d.rid, clock, d.stamp)
    apply()
    back = back + n
    redis.call('ZREM', rx, d.m)
  end
  if part.tag == 'sw' and #due > 0 then part.q = part.kind.eval(part.p, key, ovr, clock) end
  return back
end

-- Up to `units` charged now on a quota read as `q` (its eval), letting it stand at most `debt`
-- units above its size (and never past the algorithm's own bound, q.most). Reads only;
-- returns the units charged, the units it then stands above its size, and the writer.
local function reserve_charge(q, units, debt)
  local top = math.min(q.limit + debt, q.most)
  local n = math.max(0, math.min(units, top - q.count()))
  return n, math.max(0, q.count() + n - q.limit), function() if n > 0 then q.add(n) end end
end

-- How long after a lease ends the units it held can still matter (then time has given them
-- back): a window; the time a bucket or a GCRA quota of its largest size takes to be whole.
-- An expiry queue lives that long after its latest lease.
local function reserve_horizon(part)
  local p = part.p
  if part.tag == 'fw' or part.tag == 'sw' then return p.window end
  if part.tag == 'tb' then return math.ceil(bucket_max_cap(p.refill, p.step) / p.refill) * p.step end
  return math.min(RUST.quota.MAX_LIMIT, math.floor(RUST.quota.MAX_GCRA_SPAN / p.period)) * p.period
end
local function reserve_keep_queue(rx, part, ends)
  local at = redis.call('PEXPIRETIME', rx)
  local want = ends + reserve_horizon(part)
  if at < want then redis.call('PEXPIREAT', rx, s(want)) end
end

-- A reply as the record keeps it, and back.
local function reserve_pack(reply)
  local out = {}
  for i = 1, #reply do out[i] = s(reply[i]) end
  return table.concat(out, ',')
end
local function reserve_unpack(text)
  local out = {}
  for v in string.gmatch(text or '', '[^,]+') do
    if #out == 64 then break end
    local n = stored(v)
    if not n then return tampered('the reservation') end
    out[#out + 1] = n
  end
  return out
end
