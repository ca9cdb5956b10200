-- Compare-and-pexpire: extend a key's life only while it still holds our
-- value (lease renewal for a handler that runs longer than its window).
-- KEYS[1]  the guarded key
-- ARGV[1]  the value we wrote (our owner token)
-- ARGV[2]  the new time to live, in milliseconds
-- Returns 1 if extended, 0 if the key is gone or belongs to someone else.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
