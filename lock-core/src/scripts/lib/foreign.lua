local function foreign(value)
  if type(value) ~= "string" or value == "shared" or string.sub(value, 1, 8) == "permits:" then
    return 0
  end
  local token = "^" .. string.rep("[0-9a-f]", 32)
  if string.find(value, token) and (#value == 32 or string.sub(value, 33, 33) == "|") then
    return 0
  end
  return 1
end
