"""Issue #36's server items through the official `openai` Python package (and, for what the
client does not send, the standard library's HTTP client).

Usage: python openai_complete.py BASE_URL
Checks: n > 1 (chat and completions, streaming and not, seeded repeats), logprobs in the
shapes the client's types read (chat `content[].top_logprobs`, completions `tokens`,
`token_logprobs`, `top_logprobs`, `text_offset`), unsupported fields as typed 400 errors,
CORS headers and preflight, and `/metrics` in the Prometheus text format.
"""

import sys
import urllib.request

import openai

BASE = sys.argv[1]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0)
model = client.models.list().data[0].id
msgs = [{"role": "user", "content": "Name a color."}]

# n > 1, chat, not streaming: one choice per index, seeded requests repeat.
r = client.chat.completions.create(
    model=model, messages=msgs, max_tokens=10, n=3, temperature=1.0, seed=11
)
assert [c.index for c in r.choices] == [0, 1, 2], r.choices
again = client.chat.completions.create(
    model=model, messages=msgs, max_tokens=10, n=3, temperature=1.0, seed=11
)
texts = [c.message.content for c in r.choices]
assert texts == [c.message.content for c in again.choices], (texts, again.choices)
assert len(set(texts)) > 1, texts
assert r.usage.completion_tokens >= 3, r.usage

# n > 1, chat, streaming: the same texts by index, one usage chunk.
stream = client.chat.completions.create(
    model=model, messages=msgs, max_tokens=10, n=3, temperature=1.0, seed=11,
    stream=True, stream_options={"include_usage": True},
)
got = ["", "", ""]
usage = []
for chunk in stream:
    if chunk.usage is not None:
        usage.append(chunk.usage)
    for c in chunk.choices:
        got[c.index] += c.delta.content or ""
assert got == texts, (got, texts)
assert len(usage) == 1 and usage[0].completion_tokens == r.usage.completion_tokens, usage

# n > 1, completions, streaming and not.
c = client.completions.create(model=model, prompt="Count: 1 2 3", max_tokens=8, n=2)
assert [x.index for x in c.choices] == [0, 1]
assert c.choices[0].text == c.choices[1].text  # greedy
parts = ["", ""]
for chunk in client.completions.create(
    model=model, prompt="Count: 1 2 3", max_tokens=8, n=2, stream=True
):
    for x in chunk.choices:
        parts[x.index] += x.text
assert parts == [c.choices[0].text] * 2, parts

# Logprobs, chat.
r = client.chat.completions.create(
    model=model, messages=msgs, max_tokens=6, logprobs=True, top_logprobs=2
)
content = r.choices[0].logprobs.content
assert len(content) == r.usage.completion_tokens, content
for e in content:
    assert isinstance(e.token, str) and e.logprob <= 0 and isinstance(e.bytes, list)
    assert len(e.top_logprobs) == 2
    assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob

# Logprobs, completions: mlx_lm.server's `logprobs=True, top_logprobs=N` and the legacy
# `logprobs=N`.
for kwargs in ({"logprobs": 2}, {"extra_body": {"logprobs": True, "top_logprobs": 2}}):
    c = client.completions.create(model=model, prompt="Count: 1 2 3", max_tokens=6, **kwargs)
    lp = c.choices[0].logprobs
    n = c.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n, lp
    assert len(lp.text_offset) == n and lp.text_offset[0] == 0, lp
    for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 2 and top[tok] == l, (tok, l, top)

# Unsupported fields: a typed 400 naming the field.
for kwargs in (
    {"audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"]},
    {"prediction": {"type": "content", "content": "blue"}},
):
    try:
        client.chat.completions.create(model=model, messages=msgs, max_tokens=2, **kwargs)
        raise AssertionError(f"{kwargs} was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400
        assert e.body["param"] in kwargs, e.body
# Unknown extension fields are ignored.
r = client.chat.completions.create(
    model=model, messages=msgs, max_tokens=2, extra_body={"some_extension": 1}
)
assert r.choices[0].finish_reason in ("length", "stop")


def request(method, path, headers=None, data=None):
    req = urllib.request.Request(BASE + path, method=method, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, resp.headers, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


# CORS: preflight, answers, errors and streams carry the grant.
status, headers, _ = request(
    "OPTIONS", "/v1/chat/completions",
    {"Origin": "http://page.example", "Access-Control-Request-Method": "POST",
     "Access-Control-Request-Headers": "authorization, content-type"},
)
assert status == 204, status
assert headers["Access-Control-Allow-Origin"] == "*", dict(headers)
assert "authorization" in headers["Access-Control-Allow-Headers"].lower(), dict(headers)
for method, path, data, want in (
    ("GET", "/v1/models", None, 200),
    ("POST", "/v1/completions", b'{"prompt": 1}', 400),
    ("POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "stream": true}', 200),
):
    hdrs = {"Origin": "http://page.example", "Content-Type": "application/json"}
    status, headers, _ = request(method, path, hdrs, data)
    assert status == want, (path, status)
    assert headers["Access-Control-Allow-Origin"] == "*", (path, dict(headers))

# Metrics.
status, headers, text = request("GET", "/metrics")
assert status == 200 and headers["Content-Type"].startswith("text/plain"), headers
samples = {}
for line in text.splitlines():
    if line and not line.startswith("#"):
        name, value = line.rsplit(" ", 1)
        samples[name] = float(value)
for name in (
    "mlx_prompt_tokens_total", "mlx_generated_tokens_total",
    "mlx_time_to_first_token_seconds_count", "mlx_inter_token_latency_seconds_count",
    "mlx_batch_size", "mlx_prompt_cache_hits_total", "mlx_memory_active_bytes",
    "mlx_memory_peak_bytes", "mlx_memory_cache_bytes",
):
    assert name in samples, (name, text)
assert samples['mlx_requests_total{endpoint="/v1/chat/completions",status="200"}'] >= 5
assert samples['mlx_requests_total{endpoint="/v1/chat/completions",status="400"}'] >= 2
assert samples["mlx_generated_tokens_total"] > 0
print("all checks passed")
