-- Compare-and-set: replace a key's value (and its time to live) only while it
-- still holds our value. Completes an Idempotency-Key record: a request whose
-- claim expired and was taken over cannot overwrite the new owner's record.
-- KEYS[1]  the record's key
-- ARGV[1]  the value we expect (our in-progress record)
-- ARGV[2]  the new value (the completed record)
-- ARGV[3]  the new time to live, in milliseconds
-- Returns 1 if replaced, 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
