-- Fixed window counter: INCR and PEXPIRE in one atomic step, so a counter can
-- never be left without an expiry (the article's INCR-then-EXPIRE flaw).
-- The window starts at the first request.
-- KEYS[1]  the counter's key (it names the window size)
-- ARGV[1]  limit (requests per window)
-- ARGV[2]  window, in milliseconds
-- Returns {allowed (1/0), remaining, reset in microseconds}.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
-- A counter living longer than one window was not written with this
-- window (the key names it; this is a second line): start a new window.
if redis.call('PTTL', KEYS[1]) > window then
  redis.call('SET', KEYS[1], 0, 'PX', window)
end
local n = redis.call('INCR', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], window)
  ttl = window
end
local allowed = 0
if n <= limit then allowed = 1 end
local remaining = limit - n
if remaining < 0 then remaining = 0 end
return {allowed, remaining, ttl * 1000}
