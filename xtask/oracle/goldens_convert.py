"""What mlx-lm 0.32.2's own `mlx_lm.convert` writes, for `mlx convert` (issue #34).

Writes a tiny seeded llama fixture (4 layers, hidden 64, intermediate 128, untied lm_head,
float16, a generation_config.json with an eos list) to mlx-cli/tests/convert/llama/, then
runs `python -m mlx_lm convert` (the real command line, in a subprocess) on it and on other tiny
fixtures of mlx-cli/tests/models/ for every mode, bit width, group size, recipe and dtype,
and `-d` on quantized outputs. Nothing big is committed: the golden
(mlx-cli/tests/goldens/convert.json) holds, per case, the sha256 of every output file and,
for each safetensors file, every tensor's dtype, shape and sha256 of its raw bytes.

Run with `cargo xtask goldens convert`.
"""

import hashlib
import json
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import mlx.core as mx

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "mlx-cli" / "tests"
FIXTURE = CLI / "convert" / "llama"
GOLDEN = CLI / "goldens" / "convert.json"


def write_fixture():
    if FIXTURE.exists():
        shutil.rmtree(FIXTURE)
    FIXTURE.mkdir(parents=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-05,
        "vocab_size": 96,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "_name_or_path": "tiny/llama",
        "initializer_range": 0.02,
    }
    (FIXTURE / "config.json").write_text(json.dumps(config, indent=2))
    (FIXTURE / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": [2, 3]}, indent=2)
    )
    mx.random.seed(34)
    h, i, v, layers = 64, 128, 96, 4
    hd = h // 4
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for l in range(layers):
        p = f"model.layers.{l}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (h, h),
                p + "self_attn.k_proj.weight": (2 * hd, h),
                p + "self_attn.v_proj.weight": (2 * hd, h),
                p + "self_attn.o_proj.weight": (h, h),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
            }
        )
    weights = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            w = 1.0 + 0.1 * mx.random.normal(shape)
        else:
            w = 0.05 * mx.random.normal(shape)
        weights[name] = w.astype(mx.float16)
    mx.save_safetensors(str(FIXTURE / "model.safetensors"), weights)
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(CLI / "models" / "tokenizer" / f, FIXTURE / f)


TOKENIZERS = CLI / "convert" / "tokenizers"
BYTE_LEVEL = ROOT / "mlx-train" / "tests" / "models" / "dense"


def write_metaspace(out):
    """A tiny SentencePiece-style BPE (byte fallback, `▁` for spaces), trained here."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    text = ["the quick brown fox jumps over the lazy dog", "hello world, this is a tiny tokenizer",
            "in the beginning god created the heaven and the earth"] * 20
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=[f"<0x{i:02X}>" for i in range(16)], show_progress=False)
    tok.train_from_iterator(text, trainer)
    tok.add_special_tokens(["<start_of_turn>", "<end_of_turn>"])
    tok.save(str(out / "tokenizer.json"))


# Tokenizer fixtures, one a class transformers 5.25 re-saves in its own way (each staged beside
# convert/llama's weights by the "%NAME" cases): (name, source, tokenizer_config.json).
TURN = "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
BYTE_CONFIG = json.loads((BYTE_LEVEL / "tokenizer_config.json").read_text())


def added(content):
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True}


# As Hugging Face repos write them: Qwen2.5's (added_tokens_decoder, additional special tokens,
# explicit nulls, errors, split_special_tokens) and Llama 3's (PreTrainedTokenizerFast).
DECODER = {"0": added("<|endoftext|>"), "1": added("<|im_start|>"), "2": added("<|im_end|>")}
QWEN_HUB = {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": DECODER,
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
            "chat_template": BYTE_CONFIG["chat_template"], "clean_up_tokenization_spaces": False,
            "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 131072,
            "pad_token": "<|endoftext|>", "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
LLAMA3_HUB = {"added_tokens_decoder": DECODER, "bos_token": "<|im_start|>",
              "chat_template": "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}",
              "clean_up_tokenization_spaces": True, "eos_token": "<|im_end|>",
              "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 131072,
              "tokenizer_class": "PreTrainedTokenizerFast"}
TOKENIZER_CASES = [
    ("backend", "byte_level", {**BYTE_CONFIG}),
    ("qwen2", "byte_level", {**BYTE_CONFIG, "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 32768}),
    ("qwen3_5", "byte_level", {**BYTE_CONFIG, "tokenizer_class": "Qwen3_5Tokenizer"}),
    ("gpt2", "byte_level", {**BYTE_CONFIG, "tokenizer_class": "GPT2TokenizerFast", "add_prefix_space": False}),
    ("llama_byte_level", "byte_level", {**BYTE_CONFIG, "tokenizer_class": "LlamaTokenizerFast"}),
    ("llama", "metaspace", {"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                            "unk_token": "<unk>", "add_bos_token": True, "legacy": False,
                            "clean_up_tokenization_spaces": False,
                            "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"], "chat_template": TURN}),
    ("gemma", "metaspace", {"tokenizer_class": "GemmaTokenizer", "bos_token": "<s>", "eos_token": "<end_of_turn>",
                            "pad_token": "<unk>", "chat_template": TURN}),
    ("qwen2_hub", "byte_level", QWEN_HUB),
    # Gemma's BPE takes `str(unk_token)`: an explicit null is the string "None".
    ("gemma_hub", "byte_level", {**QWEN_HUB, "tokenizer_class": "GemmaTokenizerFast"}),
    ("llama3_hub", "byte_level", LLAMA3_HUB),
]


def write_tokenizers():
    if TOKENIZERS.exists():
        shutil.rmtree(TOKENIZERS)
    for name, source, config in TOKENIZER_CASES:
        d = TOKENIZERS / name
        d.mkdir(parents=True)
        if source == "byte_level":
            shutil.copy(BYTE_LEVEL / "tokenizer.json", d / "tokenizer.json")
        else:
            write_metaspace(d)
        (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def stage_tokenizer(name, staged):
    """convert/llama's files with the tokenizer fixture NAME's in place of its tokenizer."""
    shutil.copytree(FIXTURE, staged)
    for f in (TOKENIZERS / name).iterdir():
        shutil.copy(f, staged / f.name)
    return staged


def tensor_table(path):
    """dtype, shape and sha256 of each tensor's raw bytes, from the safetensors header."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for k, v in sorted(header.items()):
        if k == "__metadata__":
            out[k] = v
            continue
        a, b = v["data_offsets"]
        out[k] = [v["dtype"], v["shape"], hashlib.sha256(data[base + a : base + b]).hexdigest()[:16]]
    return out


def describe(out_dir):
    files = {}
    for f in sorted(out_dir.iterdir()):
        entry = {"sha256": hashlib.sha256(f.read_bytes()).hexdigest()[:16]}
        if f.suffix == ".safetensors":
            entry["tensors"] = tensor_table(f)
        files[f.name] = entry
    return files


# (case, source: a fixture directory or "@case" = that case's output, args)
LLAMA = "convert/llama"
CASES = [
    ("llama", LLAMA, []),
    ("llama_bf16", LLAMA, ["--dtype", "bfloat16"]),
    ("llama_f32", LLAMA, ["--dtype", "float32"]),
    ("llama_q4", LLAMA, ["-q"]),
    ("llama_q2", LLAMA, ["-q", "--q-bits", "2"]),
    ("llama_q3", LLAMA, ["-q", "--q-bits", "3"]),
    ("llama_q5", LLAMA, ["-q", "--q-bits", "5"]),
    ("llama_q6", LLAMA, ["-q", "--q-bits", "6"]),
    ("llama_q8", LLAMA, ["-q", "--q-bits", "8"]),
    ("llama_q4_g32", LLAMA, ["-q", "--q-group-size", "32"]),
    ("llama_q8_g128", LLAMA, ["-q", "--q-group-size", "128", "--q-bits", "8"]),
    ("llama_mxfp4", LLAMA, ["-q", "--q-mode", "mxfp4"]),
    ("llama_nvfp4", LLAMA, ["-q", "--q-mode", "nvfp4"]),
    ("llama_mxfp8", LLAMA, ["-q", "--q-mode", "mxfp8"]),
    ("llama_mixed_2_6", LLAMA, ["-q", "--quant-predicate", "mixed_2_6"]),
    ("llama_mixed_3_4", LLAMA, ["-q", "--quant-predicate", "mixed_3_4"]),
    ("llama_mixed_3_6", LLAMA, ["-q", "--quant-predicate", "mixed_3_6"]),
    ("llama_mixed_4_6", LLAMA, ["-q", "--quant-predicate", "mixed_4_6"]),
    ("llama_mixed_3_6_g32", LLAMA, ["-q", "--quant-predicate", "mixed_3_6", "--q-group-size", "32"]),
    ("llama_q4_bf16", LLAMA, ["-q", "--dtype", "bfloat16"]),
    ("llama_q3_f32", LLAMA, ["-q", "--q-bits", "3", "--dtype", "float32"]),
    ("llama_q4_deq", "@llama_q4", ["-d"]),
    ("llama_q3_f32_deq", "@llama_q3_f32", ["-d"]),
    ("llama_mxfp4_deq", "@llama_mxfp4", ["-d"]),
    ("llama_nvfp4_deq", "@llama_nvfp4", ["-d"]),
    ("llama_mxfp8_deq", "@llama_mxfp8", ["-d"]),
    ("llama_mixed_2_6_deq", "@llama_mixed_2_6", ["-d"]),
    ("llama_q4_deq_bf16", "@llama_q4", ["-d", "--dtype", "bfloat16"]),
    ("qwen3_q4", "models/qwen3", ["-q"]),
    ("qwen3_bf16_q8_g32", "models/qwen3_bf16", ["-q", "--q-bits", "8", "--q-group-size", "32"]),
    ("phi3_q4_g32", "models/phi3", ["-q", "--q-group-size", "32"]),
    ("gemma3_text_q4_g32", "models/gemma3_text", ["-q", "--q-group-size", "32"]),
    ("mixtral_q4_g32", "models/mixtral", ["-q", "--q-group-size", "32"]),
    ("mistral_bias_q6_g32", "models/mistral_bias_llama3rope", ["-q", "--q-bits", "6", "--q-group-size", "32"]),
    ("q4_g64_untied_deq", "models/q4_g64_untied", ["-d"]),
    # The tensors' order in the file follows each class's module order: hybrids, GPT-style
    # blocks, and wrappers whose names carry `language_model.` (per-module entries too).
    ("lfm2_q4_g32", "models/lfm2", ["-q", "--q-group-size", "32"]),
    ("gpt_neox_bf16", "models/gpt_neox", ["--dtype", "bfloat16"]),
    ("gpt2_q8_g32", "models/gpt2", ["-q", "--q-bits", "8", "--q-group-size", "32"]),
    # ("+": the fixture staged beside the tiny tokenizer's files, which it lacks.)
    ("gemma3_wrapper_q4_g32", "+../../mlx-models/tests/models/dense/gemma3_wrapper",
     ["-q", "--q-group-size", "32"]),
    ("qwen2_vl_mixed_3_6_g32", "+../../mlx-models/tests/models/dense2/qwen2_vl",
     ["-q", "--quant-predicate", "mixed_3_6", "--q-group-size", "32"]),
    # The classes' own predicates: `quant_predicate` (routers at 8 bits, group 64) and
    # `cast_predicate` (routing biases kept in float32), also through a wrapper's names.
    ("qwen3_moe_q4", "+../../mlx-models/tests/models/qwen3_moe", ["-q"]),
    ("lfm2_moe_q4_bf16", "+../../mlx-models/tests/models/moe2/lfm2_moe", ["-q", "--dtype", "bfloat16"]),
    ("deepseek_v3_bf16", "+../../mlx-models/tests/models/mla/deepseek_v3", ["--dtype", "bfloat16"]),
    ("kimi_vl_bf16", "+../../mlx-models/tests/models/mla/kimi_vl", ["--dtype", "bfloat16"]),
    ("qwen3_moe_mxfp4", "+../../mlx-models/tests/models/qwen3_moe", ["-q", "--q-mode", "mxfp4"]),
    # Found by the held-out sweep (results/quant/2026-12-04-s25-convert/): a router class
    # without `to_quantized` stays float; a predicate that reads the layer's kind (MLA layers'
    # g_proj unquantized); `ModelArgs.__post_init__` writing into `text_config`; an array on
    # the model itself left out of `total_parameters`.
    ("exaone_moe_q4_g32", "+../../mlx-models/tests/models/moe2/exaone_moe", ["-q", "--q-group-size", "32"]),
    ("bailing_moe_v3_q4_g32", "+../../mlx-models/tests/models/dense2/bailing_moe_v3",
     ["-q", "--q-group-size", "32"]),
    ("pixtral_bf16", "+../../mlx-models/tests/models/dense2/pixtral", ["--dtype", "bfloat16"]),
    ("gemma4_q4_g32", "+../../mlx-models/tests/models/dense2/gemma4", ["-q", "--q-group-size", "32"]),
    ("talkie_bf16", "+../../mlx-models/tests/models/dense2/talkie", ["--dtype", "bfloat16"]),
    # The tokenizer as transformers 5.25 re-saves each class ("%NAME": convert/llama beside
    # the tokenizer fixture convert/tokenizers/NAME); a qwen2 model type re-saves a
    # PreTrainedTokenizerFast source as Qwen2Tokenizer.
    *[(f"tokenizer_{name}", f"%{name}", ["--dtype", "bfloat16"]) for name, _, _ in TOKENIZER_CASES],
    ("qwen2_f32_bf16", "models/qwen2_f32", ["--dtype", "bfloat16"]),
    # BitNet's BitLinears stay packed (uint8 weight, its weight_scale cast), also under
    # `quantization_config` `bitnet` (an untied BitLinear head); -q quantizes only the rest.
    ("bitnet_q4_g32", "+../../mlx-models/tests/models/dense2/bitnet", ["-q", "--q-group-size", "32"]),
    ("bitnet_bf16", "+../../mlx-models/tests/models/dense2/bitnet", ["--dtype", "bfloat16"]),
    ("bitnet_untied_f32", "+../../mlx-models/tests/models/dense2/bitnet_untied_bf16", ["--dtype", "float32"]),
    ("bitnet_untied_q4_g32", "+../../mlx-models/tests/models/dense2/bitnet_untied_bf16",
     ["-q", "--q-group-size", "32"]),
]


def main():
    only = set(sys.argv[1:])
    write_fixture()
    write_tokenizers()
    golden = json.loads(GOLDEN.read_text()) if (only and GOLDEN.exists()) else {}
    golden["cases"] = golden.get("cases", {})
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for case, src, args in CASES:
            if only and case not in only and not any(c.startswith(case) for c in only):
                continue
            src_dir = tmp / src[1:] if src.startswith("@") else CLI / src.lstrip("+")
            if src.startswith("+"):
                staged = tmp / f"staged_{case}"
                shutil.copytree(src_dir, staged)
                for f in ["tokenizer.json", "tokenizer_config.json"]:
                    shutil.copy(CLI / "models" / "tokenizer" / f, staged / f)
                src_dir = staged
            if src.startswith("%"):
                src_dir = stage_tokenizer(src[1:], tmp / f"staged_{case}")
            out = tmp / case
            cmd = [sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(src_dir),
                   "--mlx-path", str(out)] + args
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"{case}: mlx_lm.convert failed:\n{r.stdout}\n{r.stderr}")
            info = [l for l in r.stdout.splitlines() if l.startswith("[INFO]")]
            golden["cases"][case] = {
                "source": src,
                "args": args,
                "info": info,
                "files": describe(out),
            }
            print(case, len(golden["cases"][case]["files"]), "files")
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    # One case a line; sha256 digests cut to 16 hex digits (64 bits) to keep the file small.
    lines = [
        json.dumps(k) + ": " + json.dumps(v, sort_keys=True, separators=(",", ":"))
        for k, v in sorted(golden["cases"].items())
    ]
    GOLDEN.write_text('{"cases": {\n' + ",\n".join(lines) + "\n}}\n")


if __name__ == "__main__":
    main()
