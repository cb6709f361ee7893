"""Tool calls through the official `openai` Python package, on a model whose greedy reply is a
tool call (mlx-server/tests/fixtures/tools_qwen3: Qwen3's chat template, `<tool_call>` markers).

Usage: python openai_tools.py BASE_URL
Checks: the reasoning and typed `tool_calls` of a reply (non-streaming, and streamed deltas assembled by
index), `finish_reason == "tool_calls"`, a second turn carrying the call and the tool's result
back, the model's context length surfacing as `BadRequestError`, and embeddings (base64, as
the client asks for them, and float).
"""

import json
import sys

import openai

BASE = sys.argv[1]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0)
model = client.models.list().data[0].id
tools = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
messages = [{"role": "user", "content": "What is the weather in Paris?"}]
ARGS = {"city": "Paris", "unit": "celsius"}

r = client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=16)
choice = r.choices[0]
assert choice.finish_reason == "tool_calls", choice
assert choice.message.content == "\n\nLet me check. ", choice.message
assert choice.message.reasoning == "\nThe user wants the weather in Paris.\n", choice.message
(call,) = choice.message.tool_calls
assert call.type == "function" and call.function.name == "get_weather", call
assert json.loads(call.function.arguments) == ARGS, call.function.arguments
assert call.id.startswith("call_")

# Streaming: content first, then the call as a delta with an index.
content, calls, finish = "", {}, None
for chunk in client.chat.completions.create(model=model, messages=messages, tools=tools,
                                            max_tokens=16, stream=True):
    d = chunk.choices[0].delta
    content += d.content or ""
    for tc in d.tool_calls or []:
        c = calls.setdefault(tc.index, {"name": "", "arguments": ""})
        c["name"] += tc.function.name or ""
        c["arguments"] += tc.function.arguments or ""
    finish = chunk.choices[0].finish_reason or finish
assert content == "\n\nLet me check. " and finish == "tool_calls", (content, finish)
assert list(calls) == [0] and calls[0]["name"] == "get_weather", calls
assert json.loads(calls[0]["arguments"]) == ARGS

# The call and its result go back in the next turn (the template renders both).
turn = messages + [
    {"role": "assistant", "content": choice.message.content,
     "tool_calls": [{"id": call.id, "type": "function",
                     "function": {"name": call.function.name,
                                  "arguments": call.function.arguments}}]},
    {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"},
]
r2 = client.chat.completions.create(model=model, messages=turn, tools=tools, max_tokens=16)
assert r2.usage.prompt_tokens > r.usage.prompt_tokens + 40, (r2.usage, r.usage)
assert r2.choices[0].finish_reason == "tool_calls"

# The model's context length (2048) is the limit.
try:
    client.completions.create(model=model, prompt="x" * 2040, max_tokens=16)
    raise AssertionError("a prompt past the model's context was accepted")
except openai.BadRequestError as e:
    assert e.code == "context_length_exceeded" and "2048" in str(e), e
# Embeddings (the client asks for base64 and decodes it).
e = client.embeddings.create(model=model, input=["hello", "Paris"])
assert [d.index for d in e.data] == [0, 1] and e.usage.prompt_tokens == 10, e.usage
for d in e.data:
    assert len(d.embedding) == 32 and abs(sum(x * x for x in d.embedding) - 1) < 1e-5
f = client.embeddings.create(model=model, input="Paris", encoding_format="float")
assert f.data[0].embedding == e.data[1].embedding
print("openai tools: all checks passed")
