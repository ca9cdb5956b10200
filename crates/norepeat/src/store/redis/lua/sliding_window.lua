-- Sliding window from two weighted fixed windows, kept in one hash so the
-- operation touches one key (one cluster slot). Clock: Redis TIME, so every
-- instance sharing the store agrees on the window.
-- KEYS[1]  the limiter's hash: fields i (window index), c (current), p (previous);
--          the key names the window size, so another size never reads it
-- ARGV[1]  limit (requests per window)
-- ARGV[2]  window, in microseconds
-- Returns {allowed (1/0), remaining, reset in microseconds}.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local v = redis.call('HMGET', KEYS[1], 'i', 'c', 'p')
local i = tonumber(v[1])
-- A state from the next window (Redis TIME stepped back a little, or a
-- failover to a replica whose clock lags) is kept: move now up to its
-- window's start. One further ahead is stale (another window size wrote
-- it, or the clock jumped): obeying it would refuse every call until then.
if i ~= nil and i > math.floor(now / window) + 1 then i = nil end
if i ~= nil and i * window > now then now = i * window end
local index = math.floor(now / window)
local c = tonumber(v[2]) or 0
local p = tonumber(v[3]) or 0
if i == nil or i < index - 1 then
  c = 0; p = 0
elseif i == index - 1 then
  p = c; c = 0
end
local elapsed = now - index * window
local share = (window - elapsed) / window
local allowed = 0
local reset
if p * share + c + 1 <= limit then
  allowed = 1
  c = c + 1
  reset = window - elapsed
else
  local room = limit - 1 - c
  if room >= 0 and p > 0 then
    reset = math.ceil(window * (1 - room / p)) - elapsed
  else
    local weight = 0
    if c > 0 then
      weight = math.ceil(window * (1 - (limit - 1) / c))
      if weight < 0 then weight = 0 end
    end
    reset = window - elapsed + weight
  end
  if reset < 1 then reset = 1 end
end
redis.call('HSET', KEYS[1], 'i', string.format('%.0f', index), 'c', c, 'p', p)
-- The state matters until the end of the next window: expire then, at a
-- fixed time, so a refused client calling again never pushes it further.
redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', math.ceil((index + 2) * window / 1000)))
local remaining = math.floor(limit - (p * share + c))
if remaining < 0 then remaining = 0 end
return {allowed, remaining, reset}
