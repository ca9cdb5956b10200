-- GCRA: one stored number per key, the theoretical arrival time (TAT), in
-- microseconds of Redis TIME so every instance shares one clock.
-- A request is admitted when max(TAT, now) + emission - burst * emission <= now.
-- KEYS[1]  the limiter's key (it names the emission interval)
-- ARGV[1]  emission interval, in microseconds (1 / sustained rate)
-- ARGV[2]  burst (requests allowed at once, at least 1)
-- Returns {allowed (1/0), remaining, reset in microseconds}.
local emission = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
-- This quota never stores a TAT beyond now + burst * emission; one further
-- ahead (another quota wrote it, or TIME stepped back) is capped there, so
-- the wait is at most one emission interval.
if tat > now + emission * burst then tat = now + emission * burst end
local new_tat = tat + emission
local allow_at = new_tat - emission * burst
if allow_at > now then
  return {0, 0, allow_at - now}
end
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.ceil((new_tat - now) / 1000))
return {1, math.floor((now + emission * burst - new_tat) / emission), new_tat - now}
