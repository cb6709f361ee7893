"""Structured output through the official `openai` client: `chat.completions.parse` with a
Pydantic model (the client sends its strict JSON schema: `title`s, `additionalProperties:
false`), `json_object`, a forced tool call, and a bad schema as a typed 400.
Usage: openai_structured.py BASE_URL TOOLS_BASE_URL"""
import json
import sys
from typing import List, Literal

import openai
from pydantic import BaseModel, Field

chat = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0)
tools_client = openai.OpenAI(base_url=sys.argv[2] + "/v1", api_key="unused", max_retries=0)
ask = [{"role": "user", "content": "Describe a person as JSON."}]


class Person(BaseModel):
    name: str = Field(max_length=10)
    age: int = Field(ge=0, le=120)
    color: Literal["red", "green", "blue"]
    tags: List[str] = Field(max_length=2)


# Greedy only: the other servers of this test binary run in the same process, and MLX's
# random key is process-wide (sampling is tested in structured.rs).
for extra in ({},):
    r = chat.chat.completions.parse(model="default_model", messages=ask, response_format=Person,
                                    max_tokens=600, **extra)
    p = r.choices[0].message.parsed
    assert isinstance(p, Person), r
    assert r.choices[0].finish_reason == "stop", r

    text = ""
    with chat.chat.completions.stream(model="default_model", messages=ask,
                                      response_format=Person, max_tokens=600, **extra) as s:
        for event in s:
            if event.type == "content.delta":
                text += event.delta
        final = s.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Person), final
    assert Person.model_validate_json(text) == final.choices[0].message.parsed

r = chat.chat.completions.create(model="default_model", messages=ask, max_tokens=600,
                                 response_format={"type": "json_object"},
                                 logit_bias={"97": 30})
assert isinstance(json.loads(r.choices[0].message.content), dict), r

try:
    chat.chat.completions.create(
        model="default_model", messages=ask, max_tokens=8,
        response_format={"type": "json_schema", "json_schema": {
            "name": "bad", "schema": {"type": "object",
                                      "properties": {"a": {"type": "nonsense"}}}}})
    raise AssertionError("a bad schema was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and "nonsense" in str(e), e
    assert e.body["param"] == "response_format.json_schema.schema", e.body

tools = [{"type": "function", "function": {
    "name": "get_time", "description": "The time in a zone.",
    "parameters": {"type": "object",
                   "properties": {"zone": {"enum": ["UTC", "CET"]},
                                  "hours": {"type": "integer", "minimum": 0, "maximum": 23}},
                   "required": ["zone", "hours"], "additionalProperties": False}}}]
r = tools_client.chat.completions.create(
    model="default_model", messages=[{"role": "user", "content": "Weather in Paris?"}],
    tools=tools, tool_choice={"type": "function", "function": {"name": "get_time"}},
    max_tokens=300)
(call,) = r.choices[0].message.tool_calls
assert call.function.name == "get_time", call
args = json.loads(call.function.arguments)
assert args["zone"] in ("UTC", "CET") and 0 <= args["hours"] <= 23, args
assert r.choices[0].finish_reason == "tool_calls"
print("all checks passed")
