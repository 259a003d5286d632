-- redcount: one quota take (or peek), shared by the four quota_*.lua scripts: validate,
-- answer a replay, read and decide with the algorithm's eval (lib_*.lua), consume only
-- what is allowed. KEYS[1] the state, KEYS[2] the subject's override; ARGV[peek_at] "1" to
-- peek (report what this call would get, consume nothing, write nothing).
-- Reply: {allowed, limit, remaining, reset_ms, retry_after_ms}.
local function take_quota(p, eval, peek_at)
  local peek = flag('peek', ARGV[peek_at])
  local replay, finish = idempotency(2, peek_at)
  if replay then return replay end
  local q = eval(p, KEYS[1], KEYS[2], now_us)
  -- Only a call that took something stores its reply: a denied call changed nothing, so
  -- its retry is a new call, and a flood of denied calls with fresh keys stores nothing.
  local take = q.allowed and not peek
  if take then q.take() end
  return finish(q.reply(), take)
end
