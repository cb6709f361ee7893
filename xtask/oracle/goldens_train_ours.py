"""mlx-lm 0.32.2 reads the adapters OUR `mlx train` writes.

For each run below, trains with our built binary (`mlx train`, from `target/debug/mlx`, built
with `cargo build -p mlx-cli` first unless `MLX_BIN` names one) on the tiny seeded fixtures of
`goldens_train.py`, which writes mlx-train/tests/adapters/ours_<run>/ (adapters.safetensors,
adapter_config.json as our binary wrote them, committed as fixtures), then loads that adapter
with mlx-lm's own loader (`mlx_lm.utils.load(model, adapter_path=...)`) and records:
- `argv`: the `mlx train` flags (params `argv`, `model`, `data`, `config`) so the Rust test
  trains the same way;
- `loaded`: every adapter parameter of mlx-lm's model after loading (names sorted), which
  must be the file's arrays: nothing of ours ignored, nothing left at its initial value (for
  the `--fine-tune-type full` runs: the model's arrays under the file's names);
- `logits`: mlx-lm's logits with our adapter on fixed ids, and mlx-lm's greedy continuation
  (`mlx_lm.generate.generate_step`, 6 tokens).
Writes goldens/train_ours.safetensors and data/configs/ours_<run>.yaml.
Run with `cargo xtask goldens train_ours` (after `goldens train`, which makes the fixtures).
"""

import os
import shutil
import subprocess

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.utils import load

from golden import Golden

ROOT = "mlx-train/tests"

# name: (model, data, yaml config, extra flags)
RUNS = {
    "q4_chat_dora_keys": (
        "q4",
        "chat",
        "lora_parameters:\n  rank: 4\n  dropout: 0.0\n  scale: 6.0\n"
        "  keys: [self_attn.q_proj, self_attn.v_proj, mlp.down_proj]\n",
        ["--fine-tune-type", "dora", "--num-layers", "2", "--batch-size", "2",
         "--iters", "4", "--learning-rate", "2e-2", "--mask-prompt", "--seed", "5",
         "--optimizer", "adamw", "--steps-per-eval", "100", "--val-batches", "1"],
    ),
    "dense_completions_lora": (
        "dense",
        "completions",
        "lora_parameters:\n  rank: 8\n  dropout: 0.0\n  scale: 16.0\n",
        ["--num-layers", "-1", "--batch-size", "2", "--iters", "3",
         "--learning-rate", "1e-2", "--seed", "9", "--steps-per-eval", "100",
         "--val-batches", "1"],
    ),
    # Full fine-tuning: adapters.safetensors holds the trained layer weights.
    "dense_text_full": (
        "dense",
        "text",
        "mask_prompt: false\n",
        ["--fine-tune-type", "full", "--num-layers", "1", "--batch-size", "2",
         "--iters", "3", "--learning-rate", "2e-3", "--seed", "8", "--optimizer", "adamw",
         "--steps-per-eval", "100", "--val-batches", "1"],
    ),
    "q4_chat_full": (
        "q4",
        "chat",
        "mask_prompt: true\n",
        ["--fine-tune-type", "full", "--num-layers", "-1", "--batch-size", "2",
         "--iters", "3", "--learning-rate", "2e-2", "--seed", "3",
         "--steps-per-eval", "100", "--val-batches", "1"],
    ),
}

LOGIT_IDS = [3, 50, 7, 99, 120, 4, 8, 200, 31]


def binary():
    if os.environ.get("MLX_BIN"):
        return os.environ["MLX_BIN"]
    subprocess.run(["cargo", "build", "-q", "-p", "mlx-cli"], check=True)
    return "target/debug/mlx"


def main():
    mlx = binary()
    g = Golden(f"{ROOT}/goldens/train_ours.safetensors", __file__)
    os.makedirs(f"{ROOT}/data/configs", exist_ok=True)
    for name, (model_name, data, yaml, flags) in RUNS.items():
        run = f"ours_{name}"
        adapter_dir = f"{ROOT}/adapters/{run}"
        shutil.rmtree(adapter_dir, ignore_errors=True)
        cfg = f"{ROOT}/data/configs/{run}.yaml"
        with open(cfg, "w") as f:
            f.write(yaml)
        model_dir = f"{ROOT}/models/{model_name}"
        subprocess.run(
            [mlx, "train", "--model", model_dir, "--data", f"{ROOT}/data/{data}",
             "-c", cfg, "--adapter-path", adapter_dir, "--train", *flags],
            check=True,
        )
        os.remove(f"{adapter_dir}/train_log.jsonl")
        g.case(f"{name}_argv", "mlx_train", [], [mx.zeros((1,))],
               argv=flags, model=model_name, data=data, config=f"{run}.yaml")

        # mlx-lm's own loader applies our adapter.
        model, _ = load(model_dir, adapter_path=adapter_dir)
        ours = mx.load(f"{adapter_dir}/adapters.safetensors")
        full = "full" in flags
        loaded = {
            k: v for k, v in tree_flatten(model.parameters())
            if (k in ours if full else k.rsplit(".", 1)[-1] in ("lora_a", "lora_b", "m"))
        }
        assert sorted(loaded) == sorted(ours), (sorted(loaded), sorted(ours))
        names = sorted(ours)
        for k in names:
            assert mx.array_equal(loaded[k], ours[k]).item(), k
        g.case(f"{name}_loaded", "load_adapters", [], [loaded[k] for k in names], names=names)

        ids = mx.array([LOGIT_IDS], mx.int32)
        logits = model(ids)
        toks = []
        for (tok, _), _ in zip(generate_step(ids[0], model), range(6)):
            toks.append(int(tok))
        g.case(f"{name}_logits", "forward", [ids], [logits, mx.array(toks, mx.int32)])
    g.save()


main()
