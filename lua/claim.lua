-- redcount: once-per-window claim ("one prize per user per 24 h").
-- KEYS[1]  the claim key of one subject
-- ARGV[1]  window in ms (1 .. 10^12)
-- Reply: {claimed, ms_left}; claimed 1 = this call took the claim, 0 = already taken.
-- ms_left is the time until the window ends (-1 if the key was given no expiry by someone else).
-- The stored value is the server time of the claim, in ms.
-- Optional: KEYS[2] + two last ARGV make it idempotent (prelude.lua).
-- (Runs after prelude.lua: int, s, idempotency.)
local w = ARGV[1]
local window = int('window', w, 1, RUST.claim.MAX_WINDOW_MS)

local replay, finish = idempotency(1, 1)
if replay then return replay end

local now = now_ms()
local ok = redis.call('SET', KEYS[1], string.format('%.0f', now), 'NX', 'PX', w)
if ok then return finish({1, window}) end
local left = redis.call('PTTL', KEYS[1])
-- A claim's key always ends with its window; one without an expiry was not written here
-- (it would block the subject for good): refused, not answered as a wait of -1.
if left < 0 then return tampered('the claim') end
-- Already taken: nothing changed, nothing stored (prelude: idempotency).
return {0, left}
