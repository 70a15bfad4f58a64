local function read(key)
  local value = redis.pcall("GET", key)
  if type(value) ~= "table" then
    return true, value
  end
  if string.sub(value.err, 1, 9) == "WRONGTYPE" then
    return false, nil
  end
  return false, value
end
local function owns(value, token)
  if value == token then
    return true
  end
  if not value or string.byte(value, #token + 1) ~= 124 then
    return false
  end
  return string.find(value, token, 1, true) == 1
end
local function not_ours(key, token)
  local ok, value = read(key)
  if not ok then
    return value or 0
  end
  if not owns(value, token) then
    return 0
  end
  return nil
end
