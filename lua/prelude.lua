-- redcount: helpers shared by every script. redcount-core prepends this file to each script
-- (script.rs), so what Redis receives is self-contained and named by the SHA-1 of the whole.

-- A canonical decimal integer within [lo, hi], or an error naming the argument. Lua's own
-- tonumber accepts "nan", "inf", "0x10", " 5 ", "1e3" and "007"; nothing of that passes here.
local function int(name, v, lo, hi)
  -- (string.find, not match: no string is made for the match; this runs on every argument.)
  if type(v) ~= 'string' or not (v == '0' or string.find(v, '^%-?[1-9]%d*$')) then
    return error({err = 'ERR redcount: ' .. name .. ' must be a decimal integer'})
  end
  -- Arithmetic reads the checked text once; tonumber reads it twice (lua_isnumber, then
  -- lua_tonumber: two strtod calls, ~1,000 instructions per argument in Redis's Lua 5.1).
  local n = v + 0
  if n == nil or n ~= n or n < lo or n > hi then
    return error({err = 'ERR redcount: ' .. name .. ' out of range'})
  end
  return n
end

-- A stored number, read only in the text redcount writes and Redis's INCRBY and HINCRBY
-- accept (canonical decimal, within 2^53): its value, else nil. Lua's tonumber also reads
-- " 1", "1e0", "0x1" and "01", which those commands refuse: a script that trusted such a
-- value (set by hand, or tampered with) wrote part of its effect and then failed on it.
local function stored(v)
  if type(v) ~= 'string' or #v > 17 or not (v == '0' or string.find(v, '^%-?[1-9]%d*$')) then return nil end
  local n = v + 0 -- (checked above; see int)
  if n > RUST.validate.MAX_SAFE or n < -RUST.validate.MAX_SAFE then return nil end
  return n
end

-- Refuses state that `stored` (or a script's own check) did not recognise, naming `what`.
local function tampered(what) return error({err = 'ERR redcount: ' .. what .. ' is not as redcount wrote it'}) end
-- Refuses a call with a key or an argument more or fewer than the script takes.
local function misshapen() return error({err = 'ERR redcount: the keys and arguments do not match the script'}) end

-- A flag argument: "1" is true, "0" false; anything else is refused, not read as "0".
local function flag(name, v)
  if v == '1' then return true elseif v == '0' then return false end
  return error({err = 'ERR redcount: ' .. name .. ' must be 0 or 1'})
end

-- A number as the exact decimal text Redis expects (tostring would print 1e+15).
local function s(n) return string.format('%.0f', n) end

-- An id as the core checks it (validate::id): 1 to 64 of A-Z a-z 0-9 _ -. Ids are stored in
-- records joined by ':' (a red packet's claim log), so a caller that skips the core must not
-- get one through that the drain could not read back.
local function id(name, v)
  if type(v) ~= 'string' or #v < 1 or #v > 64 or not string.match(v, '^[%w_%-]+$') then
    return error({err = 'ERR redcount: ' .. name .. ' must be 1 to 64 of A-Z a-z 0-9 _ -'})
  end
  return v
end

-- A subject's override of a policy's size (limit, capacity or burst), set by an admin
-- (quota_override.lua) in the subject's own slot: the stored value `v` (as GET or MGET read
-- it) when it is a whole number in 1 .. hi as quota_override.lua writes it (prelude: stored),
-- else the policy's `size`.
local function override_value(v, size, hi)
  local o = stored(v)
  if o and o >= 1 and o <= hi then return o end
  return size
end
local function override(key, size, hi) return override_value(redis.call('GET', key), size, hi) end

-- Redis's clock (not the caller's): milliseconds, and whole seconds, since the epoch.
-- (TIME answers two digit strings; arithmetic reads each once, see int.)
local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end
local function now_s() return redis.call('TIME')[1] + 0 end
-- Redis's clock in whole microseconds since the epoch (exact: below 2^53 until year 2255).
local function now_us()
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end

-- Optional idempotency, for a script that needs `need` keys: when the caller passes one key
-- more (in the same slot), plus a TTL in ms and a request fingerprint as the last two
-- arguments, the script's reply is stored there with its write. Returns the stored reply of
-- an earlier call (the caller returns it unchanged), ending in the string 'replayed', and the
-- function that stores this call's reply. The same key with another fingerprint is refused.
-- That function's second argument says whether the call changed anything: a call that changed
-- nothing (`false`) stores nothing (its retry is a new call, which answers the same while the
-- state is the same), so a flood of such calls with fresh keys costs Redis no memory.
-- With `nargs`, the script's own argument count, a call of any other shape (a key or an
-- argument too many or too few) is refused first: nothing it sent is silently ignored.
local function idempotency(need, nargs)
  local key = KEYS[need + 1]
  if #KEYS < need or #KEYS > need + 1 or (nargs and #ARGV ~= nargs + (key and 2 or 0)) then
    return misshapen()
  end
  if not key then return nil, function(reply) return reply end end
  local ttl = int('idempotency_ttl', ARGV[#ARGV - 1], 1, RUST.ops.MAX_IDEMPOTENCY_TTL_MS)
  local fp = ARGV[#ARGV]
  local prev = redis.call('GET', key)
  if prev then
    local was, body = string.match(prev, '^([^|]*)|(.*)$')
    if was ~= fp then
      -- Its own first word, so every client tells this conflict from other errors by code.
      return error({err = 'IDEMPOTENCY_CONFLICT this Idempotency-Key was already used for a different request'})
    end
    local out = {}
    -- At most 64 numbers (a decision of 8 parts has 60): the reply stays small whatever is
    -- stored; each in the text `finish` writes (stored), else the record is refused, not replayed.
    for n in string.gmatch(body, '[^,]+') do
      if #out == 64 then break end
      local v = stored(n)
      if n == '-0' then v = 0 end -- ('%.0f' of a negative zero, which arithmetic can give)
      if not v then
        return tampered('the stored reply of this Idempotency-Key')
      end
      out[#out + 1] = v
    end
    -- Marks the reply as a replay; the driver strips it (Value::take_replay_mark).
    out[#out + 1] = 'replayed'
    return out, nil
  end
  return nil, function(reply, changed)
    if changed ~= false then
      local parts = {}
      for i = 1, #reply do parts[i] = s(reply[i]) end
      redis.call('SET', key, fp .. '|' .. table.concat(parts, ','), 'PX', s(ttl))
    end
    return reply
  end
end

