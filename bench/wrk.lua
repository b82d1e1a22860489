-- wrk script of scripts/bench. The scenario comes from the environment:
--   BENCH_MODE   get | post | keyed | replay | burst
--   BENCH_RUN    a token that makes this run's keys unique (keys never repeat across runs)
--   BENCH_HOST   Host header to send (routes the gateway to the payment service); empty: wrk's
--   BENCH_PATH   request path (default /payments for keyed modes, / otherwise)
--   BENCH_KEYS   replay: size of the fixed key set (default 1000)
--   BENCH_REPLAY replay: fraction of requests that reuse a key of the fixed set (default 0.9)
--   BENCH_BURST  burst: identical requests per key (default 50)
-- Keys: keyed → a fresh key per request (run, thread id, counter); replay → a key of the fixed
-- set with probability BENCH_REPLAY, else a fresh one; burst → the key changes every BENCH_BURST
-- requests of a thread, so the thread's connections send that many identical requests at once.
-- The body is a payment-service payment whose ids are the key: the same key always carries the
-- same body (a replay, never a fingerprint mismatch).
-- done() prints one line: RESULT requests=… rps=… p50_ms=… p99_ms=… p999_ms=… s2xx=… s409=…

local mode = os.getenv("BENCH_MODE") or "get"
local run = os.getenv("BENCH_RUN") or "run"
local host = os.getenv("BENCH_HOST") or ""
local keyed = mode == "keyed" or mode == "replay" or mode == "burst"
local path = os.getenv("BENCH_PATH") or (keyed and "/payments" or "/")
local key_set = tonumber(os.getenv("BENCH_KEYS") or "1000")
local replay_fraction = tonumber(os.getenv("BENCH_REPLAY") or "0.9")
local burst = tonumber(os.getenv("BENCH_BURST") or "50")

local threads = {}
local thread_count = 0

function setup(thread)
  thread_count = thread_count + 1
  thread:set("id", thread_count)
  table.insert(threads, thread)
end

local counter = 0
-- Globals, not locals: done() reads them from each thread with thread:get().
s2xx, s409, sother = 0, 0, 0

function init(args)
  math.randomseed(id * 7919 + os.time())
  if host ~= "" then wrk.headers["Host"] = host end
  if mode ~= "get" then
    wrk.method = "POST"
    wrk.headers["Content-Type"] = "application/json"
  end
  if mode == "post" then
    wrk.body = '{"order_id":"o-1","amount":"10.00"}'
  end
end

local function payment(key)
  return '{"order_id":"' .. key .. '","customer_id":"c-1","provider":"bench",' ..
         '"external_payment_id":"' .. key .. '","amount":"10.00"}'
end

-- wrk.format() takes either its own header table or wrk.headers, not both: build the whole set.
local function keyed_request(key)
  local headers = { ["Idempotency-Key"] = key, ["Content-Type"] = "application/json" }
  if host ~= "" then headers["Host"] = host end
  return wrk.format(nil, path, headers, payment(key))
end

function request()
  counter = counter + 1
  if mode == "keyed" then
    return keyed_request(run .. "-" .. id .. "-" .. counter)
  elseif mode == "replay" then
    if math.random() < replay_fraction then
      return keyed_request(run .. "-fixed-" .. math.random(1, key_set))
    end
    return keyed_request(run .. "-" .. id .. "-" .. counter)
  elseif mode == "burst" then
    return keyed_request(run .. "-" .. id .. "-b" .. math.floor((counter - 1) / burst))
  end
  return wrk.format(nil, path)
end

if keyed then
  function response(status, headers, body)
    if status >= 200 and status < 300 then
      s2xx = s2xx + 1
    elseif status == 409 then
      s409 = s409 + 1
    else
      sother = sother + 1
    end
  end
end

function done(summary, latency, requests)
  local t2xx, t409, tother = 0, 0, 0
  for _, thread in ipairs(threads) do
    t2xx = t2xx + (thread:get("s2xx") or 0)
    t409 = t409 + (thread:get("s409") or 0)
    tother = tother + (thread:get("sother") or 0)
  end
  local e = summary.errors
  local seconds = summary.duration / 1e6
  io.write(string.format(
    "RESULT requests=%d seconds=%.2f rps=%.0f p50_ms=%.2f p99_ms=%.2f p999_ms=%.2f " ..
    "socket_errors=%d non2xx3xx=%d s2xx=%d s409=%d sother=%d\n",
    summary.requests, seconds, summary.requests / seconds,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    latency:percentile(99.9) / 1000,
    e.connect + e.read + e.write + e.timeout, e.status, t2xx, t409, tother))
end
