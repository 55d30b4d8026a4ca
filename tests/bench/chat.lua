-- wrk script for tests/bench/run: posts a small non-streaming chat request on every connection and, when
-- the run is over, prints one line "ATC-BENCH {json}" with the totals and latency percentiles (in
-- microseconds) for the runner to parse. The model name comes from the environment (ATC_BENCH_MODEL);
-- with ATC_BENCH_DELAY_MS set, each connection waits that many milliseconds between requests (a paced
-- load; wrk leaves the wait out of the latency it reports).

local model = os.getenv("ATC_BENCH_MODEL") or "llama-3-8b"
local delay_ms = tonumber(os.getenv("ATC_BENCH_DELAY_MS") or "")

if delay_ms ~= nil and delay_ms > 0 then
    function delay()
        return delay_ms
    end
end

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model": "' .. model .. '", "max_tokens": 1, "stream": false, '
    .. '"messages": [{"role": "user", "content": "Say hello in one word."}]}'

function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        'ATC-BENCH {"requests": %d, "duration_us": %d, "bytes": %d, "connect_errors": %d, '
            .. '"read_errors": %d, "write_errors": %d, "status_errors": %d, "timeouts": %d, '
            .. '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d, "mean_us": %.1f}\n',
        summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
        e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
        latency.max, latency.mean))
end
