-- redcount: a counting semaphore with one lease per holder, as functions shared by
-- semaphore.lua and decide.lua.
-- State: KEYS set: sorted set, member = holder id, score = lease end in ms (server time);
--        KEYS tokens: hash, holder id -> its fencing token; '#' -> the last token issued;
--        KEYS ovr: the semaphore's override of the limit (quota_override.lua sets it).
-- A fencing token is minted with each new lease, kept by renewals, strictly increasing per
-- semaphore, and at least the server time in µs, so it keeps increasing even after the
-- semaphore's keys expired.

-- The parameters at ARGV[a .. a+2]: holder id, limit (1 .. 10^6), lease in ms (1 .. 10^10).
local function lease_args(a)
  return {
    holder = id('holder', ARGV[a]),
    limit = int('limit', ARGV[a + 1], 1, RUST.semaphore.MAX_LIMIT),
    lease = int('lease', ARGV[a + 2], 1, RUST.semaphore.MAX_LEASE_MS),
  }
end

-- Removes the leases over at `now` (ms) with their tokens, at most 250 per call, so no call
-- pays for a long backlog at once (live leases are counted apart: lease_live).
local function lease_reclaim(set, tokens, now)
  local gone = redis.call('ZRANGEBYSCORE', set, '-inf', s(now), 'LIMIT', 0, 250)
  if #gone > 0 then
    redis.call('ZREM', set, unpack(gone))
    redis.call('HDEL', tokens, unpack(gone))
  end
end

-- Leases live at `now` (ms): those not yet reclaimed but over do not count.
local function lease_live(set, now) return redis.call('ZCOUNT', set, '(' .. s(now), '+inf') end

-- The semaphore's state is refused whole, before anything is written, when it is not as this
-- file writes it (set by hand, or tampered with): a token that is not a positive whole number
-- in redcount's text (prelude: stored) would break "strictly increasing", and a lease end
-- that is not a whole number of ms (inf, 1e300) would fail PEXPIREAT after the lease was
-- written. (Read with the commands of the right type, so a key of another type fails here.)
local function lease_refuse()
  return tampered('the semaphore')
end
local function lease_number(v)
  if not v then return 0 end
  local n = stored(v)
  if not n or n < 1 then return lease_refuse() end
  return n
end

-- A holder's token (0 when it has none), and the last token issued (0 when none).
local function lease_token_of(tokens, h)
  local t = redis.call('HMGET', tokens, h, '#')
  local n = lease_number(t[1])
  if n > lease_number(t[2]) then return lease_refuse() end -- above every token issued
  return n
end
local function lease_last_token(tokens) return lease_number(redis.call('HGET', tokens, '#')) end

-- Checks what every write of this file builds on: the last token issued and the latest
-- lease end (lease_keep sets the keys' expiry from it).
local function lease_check(set, tokens)
  lease_last_token(tokens)
  local last = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')
  if #last > 0 then lease_number(last[2]) end
end

-- Ms until the earliest lease live at `now` ends (-1 when none is live).
local function lease_earliest(set, now)
  local first = redis.call('ZRANGEBYSCORE', set, '(' .. s(now), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #first == 0 then return -1 end
  return tonumber(first[2]) - now
end

-- A new lease's token for holder h: after every token issued, never below `now_us`.
local function lease_mint(tokens, h, now_us)
  local t = math.max(lease_last_token(tokens) + 1, now_us)
  redis.call('HSET', tokens, '#', s(t), h, s(t))
  return t
end

-- After a write: the set lives exactly as long as its longest lease, so idle semaphores
-- vanish; the tokens one lease longer, so a check tells "ended" from "never held" a while.
local function lease_keep(set, tokens, lease)
  local last = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')
  if #last > 0 then
    redis.call('PEXPIREAT', set, s(tonumber(last[2])))
    redis.call('PEXPIREAT', tokens, s(tonumber(last[2]) + lease))
  elseif redis.call('EXISTS', tokens) == 1 then
    redis.call('PEXPIRE', tokens, s(lease))
  end
end

-- An acquire of p.holder (a renewal when it holds a live lease), read at server time
-- `now_us` and decided; writes nothing. Returns a table: allowed, retry (ms until the
-- earliest lease ends, when full), take() to acquire (only when allowed), and reply():
-- {code, limit, in_use, earliest_ms, retry_after_ms, lease_ms, fencing_token}, code 0
-- full, 1 a new lease, 2 the held lease renewed (as it would be, before take()).
local function lease_eval(p, set, tokens, ovr, now_us)
  local limit = override(ovr, p.limit, RUST.semaphore.MAX_LIMIT)
  local now = math.floor(now_us / 1000)
  lease_check(set, tokens)
  local held = tonumber(redis.call('ZSCORE', set, p.holder))
  if held and held <= now then held = nil end -- over, not yet reclaimed
  -- Read before take() writes anything (it may be refused: lease_number).
  local held_token = held and lease_token_of(tokens, p.holder) or 0
  local in_use = lease_live(set, now)
  local q = {allowed = held ~= nil or in_use < limit, retry = 0}
  local code, token, lease_left = 0, 0, 0
  if held then code = 2 elseif q.allowed then code = 1 end
  if not q.allowed then q.retry = math.max(0, lease_earliest(set, now)) end
  function q.take()
    lease_reclaim(set, tokens, now)
    if held then
      redis.call('ZADD', set, 'XX', s(now + p.lease), p.holder)
      token = held_token
      if token == 0 then token = lease_mint(tokens, p.holder, now_us) end -- a lease from before tokens
    else
      redis.call('ZADD', set, 'NX', s(now + p.lease), p.holder)
      token = lease_mint(tokens, p.holder, now_us)
      in_use = in_use + 1
    end
    lease_left = p.lease
    lease_keep(set, tokens, p.lease)
  end
  function q.reply()
    return {code, limit, in_use, lease_earliest(set, now), q.retry, lease_left, token}
  end
  return q
end
