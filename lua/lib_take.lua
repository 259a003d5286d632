-- redcount: one quota take (or peek), shared by the four quota_*.lua scripts: validate,
-- answer a replay, read and decide with the algorithm's eval (lib_*.lua), consume only
-- what is allowed. KEYS[1] the state, KEYS[2] the subject's override; ARGV[peek_at] "1" to
-- peek (report what this call would get, consume nothing, write nothing).
-- Reply: {allowed, limit, remaining, reset_ms, retry_after_ms}.
local function take_quota(p, eval, peek_at)
  local peek = ARGV[peek_at] == '1'
  local replay, finish = idempotency(2)
  if replay then return replay end
  local q = eval(p, KEYS[1], KEYS[2], now_us())
  if q.allowed and not peek then q.take() end
  return finish(q.reply())
end
