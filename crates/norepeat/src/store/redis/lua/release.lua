-- Compare-and-delete: delete a key only while it still holds our value, so a
-- request whose key expired can never delete the key a later request took.
-- KEYS[1]  the guarded key
-- ARGV[1]  the value we wrote (our owner token)
-- Returns 1 if deleted, 0 if the key is gone or belongs to someone else.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
