-- wrk script: every POST new (a body, or an Idempotency-Key and a body),
-- or one of 64 completed keys (replay). Args: mode prefix path
local n = 0
function setup(thread) thread:set("tid", n); n = n + 1 end
function init(args)
  mode = args[1]; base = args[2]; prefix = base .. "-" .. tostring(tid) .. "-"; path = args[3]
  counter = 0
end
function request()
  counter = counter + 1
  local note
  if mode == "replay" then note = base .. "-r-" .. tostring(counter % 64) else note = prefix .. counter end
  local h = { ["Content-Type"] = "application/json", ["X-User-Id"] = "bench-user" }
  if mode == "key" or mode == "replay" then h["Idempotency-Key"] = note end
  if mode == "get" then return wrk.format("GET", path, { ["X-User-Id"] = "bench-user" }) end
  return wrk.format("POST", path, h, '{"sku":"SKU-1","quantity":1,"note":"' .. note .. '"}')
end
