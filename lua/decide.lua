-- redcount: a compound decision, all or nothing: several quota and semaphore policies of one
-- subject decided in one script, at one server time. Either every part admits and every
-- part is consumed, or nothing is written ("a denied call costs nothing") and the reply says
-- which part denied and when to retry.
-- ARGV[1]  number of parts n (1 .. 8)
-- ARGV[2]  "1" to peek (report, consume nothing, write nothing), else "0"
-- ARGV[3..] per part, in order: its kind, then that kind's parameters (lib_*.lua: *_args):
--   fw | sw  limit, window ms, cost       tb  capacity, refill, interval ms, cost
--   gc       rate, period ms, burst, cost  se  holder, limit, lease ms (a lease of the
--            semaphore named by the subject: acquired, or renewed when the holder has one)
-- KEYS     per part, in order: a quota's state and override (2), a semaphore's set, tokens
--          and override (3); all in the subject's slot, no key twice.
-- Reply: {allowed, denied_by, retry_after_ms, n, then 7 numbers per part}
--   denied_by: the first part that denied (1-based; 0 when allowed);
--   retry_after_ms: 0 when allowed, else the longest wait of the parts that denied;
--   a quota part: {allowed, limit, remaining, reset_ms, retry_after_ms, 0, 0};
--   a semaphore part: {code (0 full, 1 new lease, 2 renewed, 3 ended: a replay whose lease
--     is over), limit, in_use, earliest_ms, retry_after_ms, lease_ms, fencing_token}.
--   A part of a denied decision reports its state unchanged: whether it alone would admit,
--   and what remains without this call.
-- Optional: one key more + two last ARGV make it idempotent (prelude.lua); only an admitted
-- decision is stored, and a replay re-checks its leases.
-- (Runs after prelude.lua and every lib_*.lua but lib_take.lua.)

local n = int('parts', ARGV[1], 1, 8)
local peek = flag('peek', ARGV[2])
local kinds = {
  fw = {2, 3, fixed_args, fixed_eval}, sw = {2, 3, sliding_args, sliding_eval},
  tb = {2, 4, bucket_args, bucket_eval}, gc = {2, 4, gcra_args, gcra_eval},
  se = {3, 3, lease_args, lease_eval},
}
local parts, a, k = {}, 3, 1
for i = 1, n do
  local kind = kinds[ARGV[a]]
  if not kind then return error({err = 'ERR redcount: a part kind must be fw, sw, tb, gc or se'}) end
  parts[i] = {kind = kind, se = ARGV[a] == 'se', p = kind[3](a + 1), k = k}
  a, k = a + 1 + kind[2], k + kind[1]
end
local seen = {}
for i = 1, k - 1 do
  if not KEYS[i] or seen[KEYS[i]] then
    return error({err = 'ERR redcount: every part needs its own keys'})
  end
  seen[KEYS[i]] = true
end
local keys_used = k - 1
-- Nothing beyond the parts, but the idempotency key and its two arguments.
local extra = #KEYS - keys_used
if (extra ~= 0 and extra ~= 1) or #ARGV ~= a - 1 + 2 * extra then
  return error({err = 'ERR redcount: the keys and arguments do not match the parts'})
end

local replay, finish = idempotency(keys_used)
if replay then
  -- A replay tells the current truth of its leases (as semaphore.lua's replay does): a lease
  -- that has ended since, or is another's now, is reported ended (code 3, no token), and the
  -- decision no longer allowed (its quotas stay charged: it happened). Nothing is written.
  local now = now_us()
  for i = 1, n do
    local part = parts[i]
    local at = 4 + 7 * (i - 1)
    if part.se and replay[at + 1] and replay[at + 1] > 0 then
      local set, tokens = KEYS[part.k], KEYS[part.k + 1]
      local ms = math.floor(now / 1000)
      local ends = tonumber(redis.call('ZSCORE', set, part.p.holder))
      local token = tonumber(redis.call('HGET', tokens, part.p.holder))
      if ends and ends > ms and token == replay[at + 7] then
        replay[at + 3], replay[at + 6] = lease_live(set, ms), ends - ms
      else
        replay[at + 1], replay[at + 3], replay[at + 6], replay[at + 7] = 3, lease_live(set, ms), 0, 0
        if replay[1] == 1 then replay[1], replay[2], replay[3] = 0, i, 0 end
      end
      replay[at + 4] = lease_earliest(set, ms)
    end
  end
  return replay
end

-- Every part read and decided at one server time before anything is written.
local now = now_us()
local function clock() return now end -- one server time for every part
local allowed, denied_by, retry = true, 0, 0
for i = 1, n do
  local part = parts[i]
  local k1 = part.k
  if part.se then
    part.q = part.kind[4](part.p, KEYS[k1], KEYS[k1 + 1], KEYS[k1 + 2], now)
  else
    part.q = part.kind[4](part.p, KEYS[k1], KEYS[k1 + 1], clock)
  end
  if not part.q.allowed then
    if allowed then denied_by = i end
    allowed = false
    retry = math.max(retry, part.q.retry)
  end
end
if allowed and not peek then
  for i = 1, n do parts[i].q.take() end
end
local out = {allowed and 1 or 0, denied_by, retry, n}
for i = 1, n do
  local r = parts[i].q.reply()
  for j = 1, 7 do out[#out + 1] = r[j] or 0 end
end
-- Only a decision that took something stores its reply (lib_take.lua says why).
return finish(out, allowed and not peek)
