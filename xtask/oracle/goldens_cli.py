"""What mlx-lm 0.32.2's command-line tools print, for the `mlx` command's parity tests.

Fixtures (written here too, deterministic): a tiny word-level tokenizer (128 ids, `<s>` BOS,
`</s>` EOS, a chat template) in mlx-cli/tests/models/tokenizer/, and one model directory per
tiny seeded model of mlx-models/tests/models used here (llama and other architectures: dense
rows, MoE, hybrids; dense and 4-bit), under mlx-cli/tests/models/<name>/, made of symlinks to
that model's config.json and model.safetensors and to the tokenizer files. The adapter cases
use mlx-train's tiny models and the adapters mlx_lm.lora trained for them (LoRA, DoRA and
full fine-tunes).

Goldens (mlx-cli/tests/goldens/cli.json), every one through mlx-lm's own entry points run as
`python -m mlx_lm <tool>` from the repository root:
- `generate`: seeded sampling (`--seed S --temp T` and more sampler flags) on dense and 4-bit
  models; the streamed text and the "Generation: N tokens" count of its verbose output.
- `chat`: a scripted session fed on stdin (three turns, a reset, more turns, `q`); the reply
  text and token count of each turn, parsed from its output.
  Several architectures (qwen3, gemma3_text, phi3, gpt_neox, gpt2, internlm2, helium, the MoE
  and hybrid ports), `--adapter-path`, and `--max-kv-size` small enough that the rotating
  cache wraps on types with and without their own `make_cache`.
- `cache_prompt` then `generate --prompt-cache-file`: the cache file
  (mlx-cli/tests/goldens/prompt_cache_<name>.safetensors) and the continued text.
- `seed_draws`: for every tiny model fixture, how many times mlx-lm's `load` splits the global
  random key while it builds the model (seed, load, then count the splits that lead from the
  seeded key to the key after loading), with `--adapter-path` too: what `--seed` replays.
- `defines_make_cache`: whether each fixture's mlx-lm model class has `make_cache` (when not,
  `--max-kv-size` gives rotating caches).
Run with `cargo xtask goldens cli`.
"""

import json
import os
import re
import shutil
import subprocess
import sys

from tokenizers import Tokenizer, models, pre_tokenizers, processors

ROOT_MODELS = "mlx-models/tests/models"
OUT = "mlx-cli/tests/models"
GOLDENS = "mlx-cli/tests/goldens"

SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
WORDS = (
    ", . ? ! hello world the a an cat dog bird fish sun moon star rain snow wind tree leaf "
    "river sea hill road house door window book pen cup tea milk bread apple red green blue "
    "black white big small old new fast slow happy sad good bad is are was be have has do "
    "say go see come make take know think look want give use find tell ask work feel try "
    "leave call i you he she it we they me him her us them my your his its our their what "
    "who when where why how all some many one two three four five yes no not and or but if "
    "then so very"
).split()
assert len(SPECIAL) + len(WORDS) <= 128, len(SPECIAL) + len(WORDS)
VOCAB = SPECIAL + WORDS + [f"w{i}" for i in range(128 - len(SPECIAL) - len(WORDS))]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

MODELS = {
    # name under mlx-cli/tests/models -> model directory under mlx-models/tests/models
    **{m: m for m in ["dense_f32", "dense_bf16_untied", "q4_g32", "q4_g64_untied",
                      "mistral_bias_llama3rope", "qwen3_moe", "qwen3_moe_q4", "mixtral",
                      "qwen3_next", "lfm2", "gemma4_text"]},
    **{m: f"dense/{m}" for m in ["qwen3", "qwen3_bf16", "gemma3_text", "gemma3_text_q4",
                                 "phi3", "phi3_q4", "gpt_neox", "gpt_neox_sequential_q4",
                                 "gpt2", "internlm2_q4", "smollm3_q4", "helium"]},
}
# Made here by mlx-lm's own quantizer (`python -m mlx_lm convert -q`) from a model above:
# name -> (source name, bits, group size). A 4-bit hybrid (LFM2's convolutions and attention).
CONVERTED = {"lfm2_q4": ("lfm2", 4, 32)}
TRAIN_MODELS = "mlx-train/tests/models"
ADAPTERS = "mlx-train/tests/adapters"

GENERATE = [
    # name, model, args
    ("seed_dense", "dense_f32", ["--seed", "7", "--temp", "0.9"]),
    ("seed_dense_untied_bf16", "dense_bf16_untied", ["--seed", "3", "--temp", "1.2", "--top-p", "0.9"]),
    ("seed_q4", "q4_g32", ["--seed", "11", "--temp", "1.0", "--top-k", "20", "--min-p", "0.02"]),
    ("seed_q4_untied", "q4_g64_untied", ["--seed", "5", "--temp", "0.8", "--xtc-probability", "0.5",
                                         "--xtc-threshold", "0.02"]),
    ("seed_bias", "mistral_bias_llama3rope", ["--seed", "123", "--temp", "1.0", "--system-prompt",
                                              "you are a cat"]),
    ("seed_raw_kv", "mistral_bias_llama3rope", ["--seed", "42", "--temp", "1.0", "--ignore-chat-template",
                                  "--kv-bits", "4", "--kv-group-size", "32", "--quantized-kv-start", "4",
                                  "--prefill-step-size", "3"]),
    ("greedy_no_seed", "q4_g32", []),
    # Other architectures (seeded sampling needs each one's construction draws).
    ("seed_qwen3", "qwen3", ["--seed", "1", "--temp", "1.0"]),
    ("seed_qwen3_bf16", "qwen3_bf16", ["--seed", "2", "--temp", "6.0"]),
    ("seed_gemma3_text", "gemma3_text", ["--seed", "3", "--temp", "1.0"]),
    ("seed_gemma3_text_q4", "gemma3_text_q4", ["--seed", "4", "--temp", "1.0", "--top-k", "30"]),
    ("seed_phi3", "phi3", ["--seed", "5", "--temp", "1.0"]),
    ("seed_phi3_q4", "phi3_q4", ["--seed", "6", "--temp", "1.0", "--top-p", "0.95"]),
    ("seed_gpt_neox", "gpt_neox", ["--seed", "7", "--temp", "6.0"]),
    ("seed_gpt_neox_q4", "gpt_neox_sequential_q4", ["--seed", "8", "--temp", "1.0"]),
    ("seed_gpt2", "gpt2", ["--seed", "29", "--temp", "1.0"]),
    ("seed_internlm2_q4", "internlm2_q4", ["--seed", "10", "--temp", "1.0"]),
    ("seed_helium", "helium", ["--seed", "11", "--temp", "1.0"]),
    ("seed_qwen3_moe", "qwen3_moe", ["--seed", "12", "--temp", "1.0"]),
    ("seed_qwen3_moe_q4", "qwen3_moe_q4", ["--seed", "13", "--temp", "1.0"]),
    ("seed_mixtral", "mixtral", ["--seed", "14", "--temp", "1.0"]),
    ("seed_qwen3_next", "qwen3_next", ["--seed", "15", "--temp", "1.0"]),
    ("seed_lfm2", "lfm2", ["--seed", "17", "--temp", "1.0"]),
    ("seed_gemma4_text", "gemma4_text", ["--seed", "18", "--temp", "1.0"]),
    ("seed_lfm2_q4", "lfm2_q4", ["--seed", "24", "--temp", "1.0"]),
    # --adapter-path: mlx-lm builds the adapter layers after the model (more draws).
    ("seed_adapter_dora", f"{TRAIN_MODELS}/dense",
     ["--seed", "19", "--temp", "1.0", "--adapter-path", f"{ADAPTERS}/dense_chat_dora_mask"]),
    ("seed_adapter_lora_q4", f"{TRAIN_MODELS}/q4",
     ["--seed", "20", "--temp", "1.0", "--adapter-path",
      f"{ADAPTERS}/q4_completions_mask_adamw_cosine_accum"]),
    # Full fine-tunes: the trained layer weights replace the model's, nothing drawn.
    ("seed_adapter_full", f"{TRAIN_MODELS}/dense",
     ["--seed", "22", "--temp", "1.0", "--adapter-path", f"{ADAPTERS}/full_dense_text_adam"]),
    ("seed_adapter_full_q4", f"{TRAIN_MODELS}/q4",
     ["--seed", "23", "--temp", "1.0", "--adapter-path",
      f"{ADAPTERS}/full_q4_completions_adamw_accum"]),
    # --max-kv-size: a RotatingKVCache(max_kv_size, keep=4) that wraps on types without their
    # own make_cache (qwen3, phi3, smollm3); llama's and gemma3_text's make_cache ignore it.
    # (qwen2 and qwen3_5 are left out: transformers 5 loads their tokenizer as its own
    # Qwen2Tokenizer class, rebuilt from the vocabulary, not the word-level tokenizer.json.)
    ("max_kv_llama", "dense_f32", ["--max-kv-size", "7"]),
    ("max_kv_qwen3", "qwen3", ["--max-kv-size", "6", "--seed", "21", "--temp", "0.7"]),
    ("max_kv_phi3", "phi3", ["--max-kv-size", "9"]),
    ("max_kv_smollm3_q4", "smollm3_q4", ["--max-kv-size", "5"]),
    ("max_kv_gemma3_text", "gemma3_text", ["--max-kv-size", "6"]),
]
GEN_PROMPT = "hello , what is the big red sun ?"
# For the models with 96 ids (the dense rows): every word's id is below 96.
SMALL_PROMPT = "hello , is the big red sun a star ?"
GEN_TOKENS = "24"

CHAT = [
    # name, model, args, stdin lines
    ("chat_default", "dense_f32", ["--max-tokens", "10"],
     ["hello world", "what is the sun ?", "tell me a story", "q"]),
    ("chat_seeded", "q4_g32", ["--max-tokens", "12", "--temp", "0.9", "--seed", "4",
                               "--system-prompt", "you are a dog"],
     ["hello", "where is the moon ?", "r", "h", "say yes", "q"]),
    # Another architecture: mlx_lm.chat seeds with 0 before loading, so its draws count too.
    ("chat_moe", "qwen3_moe", ["--max-tokens", "8", "--temp", "0.8"],
     ["hello world", "what is the sun ?", "q"]),
    ("chat_hybrid_q4", "lfm2_q4", ["--max-tokens", "8", "--temp", "1.0", "--seed", "9"],
     ["hello", "tell me a story", "q"]),
]

CACHE = [
    # name, model, cached prompt, continued prompt
    ("cache_dense", "dense_f32", "the cat and the dog", "what is red ?"),
    ("cache_q4", "q4_g64_untied", "one two three", "four five"),
]


def rel(target, link_dir):
    return os.path.relpath(target, link_dir)


def write_fixtures():
    tdir = f"{OUT}/tokenizer"
    os.makedirs(tdir, exist_ok=True)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIAL)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    tok.save(f"{tdir}/tokenizer.json")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": TEMPLATE,
    }
    with open(f"{tdir}/tokenizer_config.json", "w") as f:
        json.dump(config, f, indent=1)
    for m, src in MODELS.items():
        d = f"{OUT}/{m}"
        os.makedirs(d, exist_ok=True)
        for name, target in [
            ("config.json", f"{ROOT_MODELS}/{src}/config.json"),
            ("model.safetensors", f"{ROOT_MODELS}/{src}/model.safetensors"),
            ("tokenizer.json", f"{tdir}/tokenizer.json"),
            ("tokenizer_config.json", f"{tdir}/tokenizer_config.json"),
        ]:
            link = f"{d}/{name}"
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(rel(target, d), link)
    for m, (src, bits, group) in CONVERTED.items():
        d = f"{OUT}/{m}"
        if os.path.exists(d):
            shutil.rmtree(d)
        mlx_lm("convert", ["--hf-path", f"{OUT}/{src}", "--mlx-path", d, "-q", "--q-bits",
                           str(bits), "--q-group-size", str(group)])
        # Keep the weights and config; the tokenizer files are the shared ones.
        for f in os.listdir(d):
            if f not in ("config.json", "model.safetensors"):
                os.remove(f"{d}/{f}")
        for f in ["tokenizer.json", "tokenizer_config.json"]:
            os.symlink(rel(f"{tdir}/{f}", d), f"{d}/{f}")


def mlx_lm(tool, args, stdin=None):
    r = subprocess.run([sys.executable, "-m", "mlx_lm", tool, *args], input=stdin,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"mlx_lm {tool} {args} failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def parse_generate(out):
    m = re.search(r"==========\n(.*)\n==========\n", out, re.S)
    assert m, out
    text = m.group(1)
    g = re.search(r"^Generation: (\d+) tokens", out, re.M)
    return {"text": text, "generation_tokens": int(g.group(1)) if g else None}


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|[\x01\x02]")


def parse_chat(out):
    """The reply of each turn: what follows the input prompt's line break up to the statistics
    line that `ChatUI.end_turn` prints."""
    out = ANSI.sub("", out)
    turns = []
    for m in re.finditer(r"› \n([^›]*?)\n  (\d+) tokens · ", out):
        turns.append({"text": m.group(1), "generation_tokens": int(m.group(2))})
    return turns


def model_dir(model):
    return model if "/" in model else f"{OUT}/{model}"


def seed_draws():
    """How many splits of the global key building each fixture takes in mlx-lm's `load`
    (`load_model`, then `load_adapters` with an adapter path: what `load` runs before the
    tokenizer, which draws nothing)."""
    import glob
    from pathlib import Path

    import mlx.core as mx
    from mlx_lm.utils import load_adapters, load_model

    makes_cache = {}

    def count(path, adapter=None):
        mx.random.seed(0)
        model, _ = load_model(Path(path))
        # Whether the class defines make_cache (then make_prompt_cache ignores max_kv_size).
        makes_cache[path] = hasattr(model, "make_cache")
        if adapter is not None:
            load_adapters(model, adapter)
        after = mx.random.state[0]
        key, n = mx.random.key(0), 0
        while not mx.array_equal(key, after).item():
            key, n = mx.random.split(key)[0], n + 1
            assert n < 100000, path
        return n

    out = {"models": {}, "adapters": [], "not_buildable": {}}
    dirs = sorted(glob.glob(f"{ROOT_MODELS}/dense/*/config.json")
                  + glob.glob(f"{ROOT_MODELS}/*/config.json")
                  + glob.glob(f"{TRAIN_MODELS}/*/config.json")
                  + [f"{OUT}/{m}/config.json" for m in CONVERTED])
    for cfg in dirs:
        d = os.path.dirname(cfg)
        try:
            out["models"][d] = count(d)
        except SystemExit as e:
            # olmo: mlx-lm's module needs a package (ai2-olmo) the oracle does not install.
            out["not_buildable"][d] = f"mlx-lm cannot build it here (exit {e})"
    for a in sorted(glob.glob(f"{ADAPTERS}/*/adapter_config.json")):
        a = os.path.dirname(a)
        with open(f"{a}/adapter_config.json") as f:
            model = json.load(f)["model"]
        out["adapters"].append({"model": model, "adapter": a, "draws": count(model, a)})
    return out, makes_cache


def main():
    write_fixtures()
    goldens = {"generator": "xtask/oracle/goldens_cli.py", "generate": [], "chat": [], "cache": []}
    for name, model, args in GENERATE:
        with open(f"{model_dir(model)}/config.json") as f:
            c = json.load(f)
        vocab = c.get("vocab_size", c.get("text_config", {}).get("vocab_size"))
        prompt = GEN_PROMPT if vocab >= len(VOCAB) else SMALL_PROMPT
        full = ["--model", model_dir(model), "--prompt", prompt, "--max-tokens", GEN_TOKENS, *args]
        r = parse_generate(mlx_lm("generate", full))
        goldens["generate"].append({"name": name, "args": full, **r})
    for name, model, args, lines in CHAT:
        full = ["--model", f"{OUT}/{model}", *args]
        out = mlx_lm("chat", full, stdin="\n".join(lines) + "\n")
        turns = parse_chat(out)
        n_turns = sum(1 for l in lines if l not in ("q", "r", "h"))
        assert len(turns) == n_turns, (turns, out)
        goldens["chat"].append({"name": name, "args": full, "lines": lines, "turns": turns})
    for name, model, cached, prompt in CACHE:
        path = f"{GOLDENS}/prompt_cache_{name}.safetensors"
        mdir = f"{OUT}/{model}"
        mlx_lm("cache_prompt", ["--model", mdir, "--prompt", cached, "--prompt-cache-file", path])
        full = ["--model", mdir, "--prompt-cache-file", path, "--prompt", prompt, "--max-tokens", "12"]
        r = parse_generate(mlx_lm("generate", full))
        goldens["cache"].append({"name": name, "model": mdir, "cached_prompt": cached,
                                 "file": path, "args": full, **r})
    goldens["seed_draws"], goldens["defines_make_cache"] = seed_draws()
    with open(f"{GOLDENS}/cli.json", "w") as f:
        json.dump(goldens, f, indent=1, ensure_ascii=False)
    print(f"wrote {GOLDENS}/cli.json", file=sys.stderr)


if __name__ == "__main__":
    main()
