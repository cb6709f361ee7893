"""mlx-lm's tuner for `cargo xtask bench train`: `python -m mlx_lm lora ARGS` (its own `main`:
argument parsing, `run`, `train_model`, `train`), with one change: the reporting callback
(which the CLI only offers for wandb/swanlab) prints each train report in the line format
`mlx train` prints, `Iter N: Train loss X, Learning Rate X, It/sec X, Tokens/sec X, Trained
Tokens N, Peak mem X GB`, so one parser reads both sides.

    python bench_train_mlx_lm.py --model DIR --train --data DIR ...
"""

import sys

import mlx_lm.lora as lora
from mlx_lm.tuner.callbacks import TrainingCallback


class Report(TrainingCallback):
    def on_train_loss_report(self, info):
        print(
            f"Iter {info['iteration']}: Train loss {info['train_loss']:.3f}, "
            f"Learning Rate {info['learning_rate']:.3e}, "
            f"It/sec {info['iterations_per_second']:.3f}, "
            f"Tokens/sec {info['tokens_per_second']:.3f}, "
            f"Trained Tokens {info['trained_tokens']}, "
            f"Peak mem {info['peak_memory']:.3f} GB",
            flush=True,
        )


lora.get_reporting_callbacks = lambda *a, **k: Report()
sys.argv = ["mlx_lm.lora"] + sys.argv[1:]
lora.main()
