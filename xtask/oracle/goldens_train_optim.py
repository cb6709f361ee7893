"""mlx-lm 0.32.2's tuner with the optimizers `mlx_lm.lora --optimizer` offers beyond
SGD/Adam/AdamW: Muon and Adafactor (mlx 0.32.4's `optim.Muon`, `optim.Adafactor`, built by
`mlx_lm.lora.train_model` from `optimizer_config`), on the tiny seeded fixtures of
`goldens_train.py` (run `cargo xtask goldens train` first; its models and data are read,
not rewritten).

Each run goes through `goldens_train.run`, so each golden holds what the other tuner goldens
hold: the batches, the adapter init, every step's training loss and the validation losses,
`adapters.safetensors` after training, the loss and gradients at the trained weights, and the
adapted and fused logits. Writes goldens/train_<run>.safetensors and adapters/<run>/.
Run with `cargo xtask goldens train_optim`.
"""

from goldens_train import run

# (model, data, overrides of mlx_lm.lora's CONFIG_DEFAULTS)
RUNS = {
    # Muon's defaults on LoRA: lora_a (in, r) is transposed for Newton-Schulz, lora_b not.
    "dense_text_muon": (
        "dense",
        "text",
        {"num_layers": 2, "batch_size": 2, "iters": 4, "learning_rate": 2e-2,
         "optimizer": "muon", "seed": 12,
         "lora_parameters": {"rank": 4, "dropout": 0.0, "scale": 10.0},
         "steps_per_eval": 100, "val_batches": 1},
    ),
    # Every Muon option off its default; full fine-tuning, so the 1-D norms take Muon's
    # plain momentum update and the (64, 32) / (32, 64) MLP weights both orientations.
    "full_dense_chat_muon_options": (
        "dense",
        "chat",
        {"fine_tune_type": "full", "num_layers": 1, "batch_size": 2, "iters": 3,
         "learning_rate": 1e-2, "optimizer": "muon",
         "optimizer_config": {"muon": {"momentum": 0.8, "weight_decay": 0.05,
                                       "nesterov": False, "ns_steps": 3}},
         "seed": 13, "steps_per_eval": 100, "val_batches": 1},
    ),
    # Adafactor's defaults (relative steps: the learning rate is ignored) on a 4-bit base.
    "q4_completions_adafactor": (
        "q4",
        "completions",
        {"num_layers": -1, "batch_size": 2, "iters": 4, "learning_rate": 1e-2,
         "optimizer": "adafactor", "mask_prompt": True, "seed": 14,
         "lora_parameters": {"rank": 4, "dropout": 0.0, "scale": 10.0},
         "steps_per_eval": 100, "val_batches": 1},
    ),
    # Every Adafactor option off its default, a scheduled learning rate (relative_step off),
    # full fine-tuning (unfactored 1-D norms next to factored matrices).
    "full_dense_text_adafactor_options": (
        "dense",
        "text",
        {"fine_tune_type": "full", "num_layers": 1, "batch_size": 2, "iters": 4,
         "learning_rate": 1e-2, "optimizer": "adafactor",
         "optimizer_config": {"adafactor": {
             "eps": [1e-29, 2e-3], "clip_threshold": 0.5, "decay_rate": -0.6,
             "beta_1": 0.9, "weight_decay": 0.02, "scale_parameter": False,
             "relative_step": False}},
         "lr_schedule": {"name": "cosine_decay", "arguments": [1e-2, 4, 1e-3], "warmup": 1},
         "seed": 15, "steps_per_eval": 100, "val_batches": 1},
    ),
    # Relative steps with warmup_init (the step-scaled minimum) and a first moment.
    "dense_chat_adafactor_warmup": (
        "dense",
        "chat",
        {"num_layers": 1, "batch_size": 2, "iters": 3, "learning_rate": 1e-2,
         "optimizer": "adafactor",
         "optimizer_config": {"adafactor": {"warmup_init": True, "beta_1": 0.5}},
         "seed": 16,
         "lora_parameters": {"rank": 2, "dropout": 0.0, "scale": 20.0},
         "steps_per_eval": 100, "val_batches": 1},
    ),
}


def main():
    for name, (model_name, data, overrides) in RUNS.items():
        run(name, model_name, data, overrides, script=__file__)


main()
