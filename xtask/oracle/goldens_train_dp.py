"""mlx_lm.lora's own data-parallel run, the L1 reference for `mlx launch -n 2 -- train`.

Runs this script under `mlx.launch -n 2 --backend ring` (MLX's launcher, from the oracle
venv). Each rank runs mlx_lm.lora's command line (`build_parser`, the config file merged as
its `main` does, then `lora.run`) on the seeded tiny llama of mlx-train/tests/models/dense
and mlx-train/tests/data/text: every rank takes its share of each batch
(`iterate_batches(comm_group=...)`), `average_gradients` all-sums the gradients before each
update, and rank 0 writes the adapters. Rank 0 then writes
mlx-train/tests/goldens/train_dp2_text_adam.safetensors with:
- every adapter tensor of the final `adapters.safetensors`, under its own name;
- `train_loss`, `val_loss`: the losses mlx-lm reported (already summed over the group);
- `single.<name>`: the same run's adapters in one process, to show the group changes them.
Run with `cargo xtask goldens train_dp` (or this file directly in the oracle venv).
"""

import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import mlx.core as mx
import yaml

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "mlx-train/tests/models/dense"
DATA = ROOT / "mlx-train/tests/data/text"
OUT = ROOT / "mlx-train/tests/goldens/train_dp2_text_adam.safetensors"
CONFIG = "lora_parameters:\n  rank: 4\n  dropout: 0.0\n  scale: 10.0\nlearning_rate: 1e-2\n"
FLAGS = [
    "--train", "--num-layers", "1", "--batch-size", "2", "--iters", "4",
    "--steps-per-eval", "2", "--val-batches", "2", "--steps-per-report", "1",
    "--save-every", "4", "--grad-accumulation-steps", "1",
]


def lora_run(adapter_dir):
    """mlx_lm.lora's `main`, recording the reported losses; rank 0 returns the adapters."""
    from mlx_lm import lora
    from mlx_lm.tuner.callbacks import TrainingCallback

    class Record(TrainingCallback):
        def __init__(self):
            self.train, self.val = [], []

        def on_train_loss_report(self, info):
            self.train.append(info["train_loss"])

        def on_val_loss_report(self, info):
            self.val.append(info["val_loss"])

    cfg = Path(adapter_dir) / "c.yaml"
    cfg.write_text(CONFIG)
    argv = ["--model", str(MODEL), "--data", str(DATA), "-c", str(cfg),
            "--adapter-path", str(Path(adapter_dir) / "adapters"), *FLAGS]
    args = vars(lora.build_parser().parse_args(argv))
    with open(cfg) as f:
        for k, v in yaml.load(f, lora.yaml_loader).items():
            if args.get(k, None) is None:
                args[k] = v
    for k, v in lora.CONFIG_DEFAULTS.items():
        if args.get(k, None) is None:
            args[k] = v
    rec = Record()
    # `lora.run` builds its own (reporting) callback: hand ours to `train_model` instead.
    train_model = lora.train_model
    lora.train_model = lambda a, m, t, v, _cb: train_model(a, m, t, v, rec)
    try:
        lora.run(types.SimpleNamespace(**args))
    finally:
        lora.train_model = train_model
    if mx.distributed.init().rank() != 0:
        return None, rec
    adapters = mx.load(str(Path(adapter_dir) / "adapters" / "adapters.safetensors"))
    return adapters, rec


def worker():
    group = mx.distributed.init(strict=True, backend="ring")
    with tempfile.TemporaryDirectory() as d:
        adapters, rec = lora_run(d)
        if group.rank() == 0:
            out = dict(adapters)
            out["train_loss"] = mx.array(rec.train, dtype=mx.float32)
            out["val_loss"] = mx.array(rec.val, dtype=mx.float32)
            single = Path(os.environ["DP_SINGLE"])
            for k, v in mx.load(str(single)).items():
                out["single." + k] = v
            mx.save_safetensors(str(OUT), out, metadata={"world_size": str(group.size())})
            print(f"wrote {OUT} (train losses {rec.train}, val losses {rec.val})")


def main():
    if os.environ.get("MLX_RANK") is not None:
        worker()
        return
    with tempfile.TemporaryDirectory() as d:
        # The one-process run first (no group: MLX's init gives the singleton).
        adapters, _ = lora_run(d)
        single = Path(d) / "single.safetensors"
        mx.save_safetensors(str(single), adapters)
        launcher = Path(sys.executable).parent / "mlx.launch"
        subprocess.run(
            [str(launcher), "-n", "2", "--backend", "ring", "--python", sys.executable, __file__],
            check=True,
            env={**os.environ, "MLX_DEVICE": "cpu", "DP_SINGLE": str(single)},
        )


if __name__ == "__main__":
    main()
