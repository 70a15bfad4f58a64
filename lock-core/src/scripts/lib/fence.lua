local function next_fence(key, keep)
  local counter = redis.pcall("GET", key)
  if type(counter) == "table" then
    return counter
  end
  local last = 0
  if counter then
    last = tonumber(counter)
    if last == nil then
      return redis.error_reply("ERR the fence counter is not a number")
    end
  end
  local now = redis.call("TIME")
  local fence = math.max(last + 1, tonumber(now[1]) * 1000000 + tonumber(now[2]))
  redis.call("SET", key, string.format("%.0f", fence), "PX", keep)
  return fence
end
local function with_fence(value, fence)
  local head, tail = string.match(value, "^([^|]*|[^|]*|)[^|]*(|.*)$")
  if not head then
    return value
  end
  return head .. string.format("%.0f", tonumber(fence)) .. tail
end
local function fence_value(key, fence)
  local value = redis.call("GET", key)
  local fenced = with_fence(value, fence)
  if fenced ~= value then
    redis.call("SET", key, fenced, "KEEPTTL")
  end
end
