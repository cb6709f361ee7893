"""Drives a running `mlx serve` with the official `openai` Python package.

Usage: python openai_client.py BASE_URL GOLDEN_JSON
Checks (each an assert; the first failure exits non-zero with its message):
- chat and completions, streaming and not, equal mlx-lm's greedy output (the goldens);
- stop strings, logprobs / top_logprobs, usage (also streamed with include_usage);
- a tool-call round trip: tools reach the chat template, an assistant tool call and the tool
  result render in the next turn;
- 4xx errors surface as the client's typed exceptions with the server's message;
- 32 concurrent streaming clients all finish with their golden text and no error.
Prints one JSON line of measurements at the end.
"""

import asyncio
import json
import sys
import time

import openai

BASE, GOLDEN = sys.argv[1], sys.argv[2]
golden = json.load(open(GOLDEN))
cases = golden["cases"]
chats = [c for c in cases if c["kind"] == "chat"]
completions = [c for c in cases if c["kind"] == "completion"]
MAX = golden["max_tokens"]

client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0)

# Models.
models = client.models.list()
model = models.data[0].id
assert models.data[0].object == "model"

# Chat, not streaming.
for c in chats:
    r = client.chat.completions.create(model=model, messages=c["messages"], max_tokens=MAX)
    assert r.choices[0].message.content == c["text"], (r.choices[0].message.content, c["text"])
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(c["prompt"]) and r.usage.completion_tokens == MAX, r.usage
    assert r.id.startswith("chatcmpl-") and r.created > 0 and r.object == "chat.completion"

# Chat, streaming, with usage.
c = chats[1]
stream = client.chat.completions.create(model=model, messages=c["messages"], max_tokens=MAX,
                                        stream=True, stream_options={"include_usage": True})
text, finish, usage = "", None, None
for chunk in stream:
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage:
        usage = chunk.usage
assert text == c["text"], (text, c["text"])
assert finish == "length" and usage.completion_tokens == MAX, (finish, usage)

# Completions, streaming and not.
for c in completions:
    r = client.completions.create(model=model, prompt=c["prompt_text"], max_tokens=MAX)
    assert r.choices[0].text == c["text"], (r.choices[0].text, c["text"])
    s = client.completions.create(model=model, prompt=c["prompt_text"], max_tokens=MAX, stream=True)
    assert "".join(ch.choices[0].text for ch in s) == c["text"]

# Stop strings: the text ends before the first one.
c = chats[0]
stop = c["text"][3:5]
r = client.chat.completions.create(model=model, messages=c["messages"], max_tokens=MAX, stop=[stop])
assert r.choices[0].finish_reason == "stop", r.choices[0]
assert r.choices[0].message.content == c["text"][: c["text"].find(stop)], r.choices[0].message.content

# Logprobs: greedy, so each token is its step's most likely one.
r = client.chat.completions.create(model=model, messages=c["messages"], max_tokens=6,
                                   logprobs=True, top_logprobs=3)
content = r.choices[0].logprobs.content
assert len(content) == 6
for lp in content:
    assert len(lp.top_logprobs) == 3
    assert lp.top_logprobs[0].token == lp.token and lp.top_logprobs[0].logprob == lp.logprob
r = client.completions.create(model=model, prompt="abc", max_tokens=4, logprobs=2)
assert len(r.choices[0].logprobs.token_logprobs) == 4

# Tools: the template sees them (the prompt grows), and a tool-call turn renders.
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
plain = client.chat.completions.create(model=model, messages=c["messages"], max_tokens=2)
with_tools = client.chat.completions.create(model=model, messages=c["messages"], max_tokens=2,
                                            tools=tools)
assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 50, with_tools.usage
turn = c["messages"] + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]
r = client.chat.completions.create(model=model, messages=turn, max_tokens=4, tools=tools)
assert r.choices[0].finish_reason in ("length", "stop", "tool_calls"), r.choices[0]

# Errors become the client's exceptions, with the server's message.
try:
    client.chat.completions.create(model="no-such-model", messages=c["messages"])
    raise AssertionError("unknown model accepted")
except openai.NotFoundError as e:
    assert "no-such-model" in str(e), e
try:
    client.chat.completions.create(model=model, messages=c["messages"], temperature=-3)
    raise AssertionError("negative temperature accepted")
except openai.BadRequestError as e:
    assert "temperature" in str(e), e

# 32 concurrent streaming clients.
async def load_test():
    aclient = openai.AsyncOpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0,
                                 timeout=600)
    async def one(i):
        c = cases[i % len(cases)]
        if c["kind"] == "chat":
            s = await aclient.chat.completions.create(model=model, messages=c["messages"],
                                                      max_tokens=MAX, stream=True)
            text = "".join([ch.choices[0].delta.content or "" async for ch in s if ch.choices])
        else:
            s = await aclient.completions.create(model=model, prompt=c["prompt_text"],
                                                 max_tokens=MAX, stream=True)
            text = "".join([ch.choices[0].text async for ch in s])
        return text == c["text"]
    t0 = time.time()
    results = await asyncio.gather(*[one(i) for i in range(32)])
    return results, time.time() - t0

results, secs = asyncio.run(load_test())
assert all(results), f"{results.count(False)} of 32 streams differ from their golden text"
print(json.dumps({"clients": 32, "tokens": 32 * MAX, "seconds": round(secs, 3),
                  "tokens_per_s": round(32 * MAX / secs, 1)}))
print("openai client: all checks passed")
