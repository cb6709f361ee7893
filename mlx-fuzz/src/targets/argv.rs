//! The `argv` target: command lines of every `mlx` subcommand, built from valid invocations
//! and mutated (bad numbers, NaN and infinities, huge values, missing values, unknown and
//! repeated flags, non-UTF-8 bytes, paths to crafted or special files), run in-process through
//! `mlx_cli::check::parse`: the real clap parser and the CLI's validation layer, which loads
//! the files the flags name (prompt caches, training configs, `info` model directories) but
//! never a model, standard input or the network.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use arbitrary::Unstructured;
use serde_json::{json, Value};

use super::{Outcome, Target};
use crate::mutate::{below, chance, mutate_bytes, mutate_json, pick};

/// Placeholders in [`SUBCOMMANDS`]' values, replaced by the files of the input.
const MODEL: &str = "@model";
const CACHE: &str = "@cache";
const YAML: &str = "@yaml";
const DIR: &str = "@dir";
const OUT: &str = "@out";

type Flag = (&'static str, &'static [&'static str]);

/// Every subcommand with its flags and valid values (an empty list: a switch).
const SUBCOMMANDS: &[(&str, &[Flag])] = &[
    (
        "generate",
        &[
            ("--model", &[MODEL]),
            ("--dtype", &["auto", "stored", "f32", "bf16"]),
            ("--adapter-path", &[DIR]),
            ("--prompt", &["hi", "-", "a\\nb", ""]),
            ("--prompt-ids", &["1,2,3", "0", "1,999999"]),
            ("--system-prompt", &["be brief"]),
            ("--prefill-response", &["Sure"]),
            ("--max-tokens", &["4", "-1", "0"]),
            ("--temp", &["0.7", "0"]),
            ("--top-p", &["0.9", "1"]),
            ("--min-p", &["0.05", "0"]),
            ("--top-k", &["20", "0"]),
            ("--xtc-probability", &["0.1", "0"]),
            ("--xtc-threshold", &["0.2", "0.1"]),
            ("--min-tokens-to-keep", &["1", "3"]),
            ("--seed", &["3", "0"]),
            ("--ignore-chat-template", &[]),
            (
                "--chat-template-config",
                &["{\"enable_thinking\": false}", "{}"],
            ),
            ("--extra-eos-token", &["</s>", "<|im_end|>"]),
            ("--verbose", &["false", "True", "f"]),
            ("--max-kv-size", &["128", "1"]),
            ("--prefill-step-size", &["16", "2048"]),
            ("--kv-bits", &["4", "8"]),
            ("--kv-group-size", &["64", "32"]),
            ("--quantized-kv-start", &["0", "5000"]),
            ("--prompt-cache-file", &[CACHE]),
            ("--stop", &["\n\n", "x"]),
            ("--top-logprobs", &["2", "0"]),
            ("--json", &[]),
        ],
    ),
    (
        "chat",
        &[
            ("--model", &[MODEL]),
            ("--dtype", &["auto", "f16"]),
            ("--adapter-path", &[DIR]),
            ("--temp", &["0.7", "0"]),
            ("--top-p", &["0.9"]),
            ("--xtc-probability", &["0.1"]),
            ("--xtc-threshold", &["0.2"]),
            ("--seed", &["0", "7"]),
            ("--max-kv-size", &["64"]),
            ("--prefill-step-size", &["8"]),
            ("--max-tokens", &["16", "-1"]),
            ("--system-prompt", &["hello"]),
            ("--json", &[]),
        ],
    ),
    (
        "cache-prompt",
        &[
            ("--model", &[MODEL]),
            ("--prompt-cache-file", &[OUT]),
            ("--prompt", &["a long system prompt"]),
            ("--kv-bits", &["4"]),
            ("--kv-group-size", &["64"]),
            ("--max-kv-size", &["256"]),
            ("--prefill-step-size", &["512"]),
            ("--quantized-kv-start", &["0"]),
            ("--eos-token", &["</s>", ""]),
        ],
    ),
    (
        "serve",
        &[
            ("--model", &[MODEL]),
            ("--host", &["127.0.0.1", "::1"]),
            ("--port", &["0", "8080"]),
            ("--temp", &["0.5"]),
            ("--top-p", &["0.95"]),
            ("--top-k", &["40"]),
            ("--min-p", &["0.1"]),
            ("--max-tokens", &["64"]),
            ("--max-tokens-limit", &["8192"]),
            ("--max-context", &["4096"]),
            ("--max-batch", &["4", "32"]),
            ("--queue-size", &["8"]),
            ("--prefill-step-size", &["256"]),
            ("--prompt-cache-size", &["0", "10"]),
            ("--prompt-cache-bytes", &["1048576"]),
            ("--api-key", &["secret"]),
            ("--max-body-bytes", &["65536"]),
            ("--request-timeout", &["30"]),
            ("--chat-template-args", &["{\"enable_thinking\": false}"]),
            ("--log-level", &["info", "debug"]),
        ],
    ),
    (
        "train",
        &[
            ("-c", &[YAML]),
            ("--model", &[MODEL]),
            ("--train", &[]),
            ("--data", &[DIR]),
            ("--fine-tune-type", &["lora", "dora"]),
            (
                "--optimizer",
                &["adam", "adamw", "muon", "sgd", "adafactor"],
            ),
            ("--mask-prompt", &[]),
            ("--num-layers", &["2", "-1"]),
            ("--batch-size", &["1", "4"]),
            ("--iters", &["10"]),
            ("--val-batches", &["-1", "2"]),
            ("--learning-rate", &["1e-5"]),
            ("--steps-per-report", &["5"]),
            ("--steps-per-eval", &["50"]),
            ("--grad-accumulation-steps", &["2"]),
            ("--adapter-path", &[DIR]),
            ("--save-every", &["100"]),
            ("--test", &[]),
            ("--test-batches", &["2"]),
            ("--max-seq-length", &["512"]),
            ("--grad-checkpoint", &[]),
            ("--seed", &["0"]),
            ("--objective", &["sft", "dpo", "orpo"]),
            ("--beta", &["0.1"]),
            ("--ce-chunk-size", &["64"]),
            ("--segment-length", &["128"]),
            ("--max-grad-norm", &["1.0"]),
        ],
    ),
    (
        "fuse",
        &[
            ("--model", &[MODEL]),
            ("--save-path", &[OUT]),
            ("--adapter-path", &[DIR]),
            ("--dequantize", &[]),
        ],
    ),
    ("models", &[("--json", &[])]),
    ("info", &[("--model", &[MODEL]), ("-m", &[MODEL])]),
    (
        "embed",
        &[
            ("--model", &[MODEL]),
            ("--text", &["hello", ""]),
            ("--dtype", &["f32", "stored"]),
        ],
    ),
    (
        "convert",
        &[
            ("--hf-path", &[MODEL]),
            ("--mlx-path", &[OUT]),
            ("-q", &[]),
            ("--q-bits", &["4", "2"]),
            ("--q-group-size", &["32", "64"]),
            ("--q-mode", &["affine", "mxfp4", "nvfp4"]),
            ("--quant-predicate", &["mixed_3_6"]),
            ("--dtype", &["float16"]),
            ("-d", &[]),
        ],
    ),
    (
        "perplexity",
        &[
            ("--model", &[MODEL]),
            ("--data-path", &[DIR]),
            ("--batch-size", &["2"]),
            ("--sequence-length", &["16"]),
            ("--num-samples", &["4", "-1"]),
            ("--seed", &["1"]),
        ],
    ),
    (
        "benchmark",
        &[
            ("--model", &[MODEL]),
            ("-p", &["8"]),
            ("-g", &["4"]),
            ("-n", &["1"]),
            ("-b", &["1"]),
        ],
    ),
];

/// Values that break number parsing and range checks.
const BAD_NUMBERS: &[&str] = &[
    "nan",
    "NaN",
    "-nan",
    "inf",
    "-inf",
    "infinity",
    "1e309",
    "-1e309",
    "1e-320",
    "-0",
    "0",
    "-1",
    "1.5",
    "0x10",
    "1_000",
    " 1",
    "1 ",
    "+1",
    "",
    "2147483648",
    "-2147483649",
    "4294967296",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999999999",
    "1,,2",
    ",",
    "-",
    "--",
];

/// Flags that no subcommand has, or has in another form.
const ODD_FLAGS: &[&str] = &[
    "--bogus",
    "-z",
    "--",
    "-",
    "--temp=",
    "--temp=nan",
    "--max-tokens=-5",
    "-m",
    "-p",
    "--prompt",
    "--model",
    "--help",
    "-h",
    "--version",
    "-V",
    "--no-chat-template",
    "--system",
    "--decode-concurrency",
    "=",
    "---x",
];

/// Special files a path flag may name (never standard input: reading it would wait).
const SPECIAL_PATHS: &[&str] = &[
    "/dev/zero",
    "/dev/null",
    "/",
    "",
    "/nonexistent/file",
    ".",
    "..",
    "smollm2",
];

impl Target {
    /// One mutated command line through the CLI's parse-and-check layer.
    pub(super) fn argv(&self, u: &mut Unstructured) -> Outcome {
        let argv = self.craft_argv(u);
        let _ = std::fs::write(
            self.current("argv"),
            argv.iter()
                .map(|a| format!("{:?}", a))
                .collect::<Vec<_>>()
                .join(" "),
        );
        match mlx_cli::check::parse(argv) {
            Ok(_) => Outcome::Accepted,
            Err(e) => {
                let m = e.message();
                if m.trim().is_empty() {
                    // A refusal must say what is wrong.
                    panic!("empty error message (exit {})", e.code());
                }
                Outcome::Refused(m)
            }
        }
    }

    fn craft_argv(&self, u: &mut Unstructured) -> Vec<OsString> {
        let (name, flags) = pick(u, SUBCOMMANDS);
        let mut args: Vec<Vec<u8>> = vec![b"mlx".to_vec(), name.as_bytes().to_vec()];
        // A valid invocation: a random subset of the flags with valid values.
        for (flag, values) in flags.iter() {
            if chance(u, 35) {
                args.push(flag.as_bytes().to_vec());
                if !values.is_empty() {
                    args.push(pick(u, values).as_bytes().to_vec());
                }
            }
        }
        for _ in 0..=below(u, 3) {
            self.mutate_argv(u, &mut args, flags);
        }
        args.into_iter()
            .map(|a| self.fill_placeholder(u, a))
            .collect()
    }

    fn mutate_argv(&self, u: &mut Unstructured, args: &mut Vec<Vec<u8>>, flags: &[Flag]) {
        let n = args.len();
        let any = |u: &mut Unstructured| 1 + below(u, n.max(2) - 1);
        match below(u, 12) {
            // A bad number in place of a value, or as a flag's value.
            0 | 1 => {
                let v = pick(u, BAD_NUMBERS).as_bytes().to_vec();
                if n > 2 && chance(u, 60) {
                    let i = any(u);
                    args[i] = v;
                } else if !flags.is_empty() {
                    let (flag, _) = pick(u, flags);
                    args.push(flag.as_bytes().to_vec());
                    args.push(v);
                }
            }
            // A missing value: drop one argument.
            2 if n > 2 => {
                let i = any(u);
                args.remove(i);
            }
            // An unknown or misplaced flag.
            3 => {
                let i = 1 + below(u, n);
                args.insert(i.min(args.len()), pick(u, ODD_FLAGS).as_bytes().to_vec());
            }
            // A flag repeated, with its value.
            4 if n > 2 => {
                let i = any(u);
                let j = (i + 2).min(n);
                let dup: Vec<Vec<u8>> = args[i..j].to_vec();
                args.extend(dup);
            }
            // Non-UTF-8 bytes in one argument.
            5 => {
                let i = any(u).min(args.len() - 1);
                let at = below(u, args[i].len() + 1);
                let bad = *pick(u, &[0xffu8, 0x80, 0xc3, 0xed, 0xfe]);
                args[i].insert(at, bad);
            }
            // Byte-level havoc on one argument.
            6 if n > 1 => {
                let i = any(u).min(args.len() - 1);
                mutate_bytes(u, &mut args[i], 2);
            }
            // A special or crafted path for a path flag.
            7 => {
                let path_flags: Vec<&Flag> = flags
                    .iter()
                    .filter(|(_, v)| v.first().is_some_and(|v| v.starts_with('@')))
                    .collect();
                if !path_flags.is_empty() {
                    let (flag, _) = pick(u, &path_flags);
                    args.push(flag.as_bytes().to_vec());
                    let p = if chance(u, 70) {
                        pick(u, SPECIAL_PATHS).as_bytes().to_vec()
                    } else {
                        let mut p = self.work.join("x").into_os_string().into_vec();
                        p.extend(std::iter::repeat_n(b'y', below(u, 5000)));
                        p
                    };
                    args.push(p);
                }
            }
            // A huge value.
            8 if n > 2 => {
                let i = any(u);
                args[i] = "x".repeat(below(u, 200_000)).into_bytes();
            }
            // `--flag=value` form.
            9 if !flags.is_empty() => {
                let (flag, values) = pick(u, flags);
                let v = if chance(u, 50) || values.is_empty() {
                    *pick(u, BAD_NUMBERS)
                } else {
                    *pick(u, values)
                };
                args.push(format!("{flag}={v}").into_bytes());
            }
            // Another subcommand's name, or none.
            10 => {
                let (other, _) = pick(u, SUBCOMMANDS);
                if chance(u, 80) && n > 1 {
                    args[1] = other.as_bytes().to_vec();
                } else if n > 1 {
                    args.remove(1);
                }
            }
            // Arguments swapped.
            _ if n > 3 => {
                let (i, j) = (any(u), any(u));
                args.swap(i, j);
            }
            _ => {}
        }
    }

    /// A placeholder replaced by its file, crafted for this input.
    fn fill_placeholder(&self, u: &mut Unstructured, a: Vec<u8>) -> OsString {
        let dir = self.work.join("argv");
        let path = match a.as_slice() {
            b"@model" => {
                // The tiny model, with a mutated config.json half of the time (`info` reads it).
                if chance(u, 50) {
                    let _ =
                        std::fs::write(self.dense_dir.join("config.json"), self.craft_config(u));
                } else {
                    let _ = std::fs::write(
                        self.dense_dir.join("config.json"),
                        self.dense_config.to_string(),
                    );
                }
                self.dense_dir.clone()
            }
            b"@cache" => {
                let p = dir.join("cache.safetensors");
                let _ = std::fs::create_dir_all(&dir);
                let _ = self.craft_prompt_cache(u, &p);
                p
            }
            b"@yaml" => {
                let p = dir.join("config.yaml");
                let _ = std::fs::create_dir_all(&dir);
                let _ = std::fs::write(&p, craft_train_config(u));
                p
            }
            b"@dir" => {
                let _ = std::fs::create_dir_all(&dir);
                dir
            }
            b"@out" => dir.join("out.safetensors"),
            _ => return OsString::from_vec(a),
        };
        path.into_os_string()
    }
}

/// A training config file: valid options (mlx_lm.lora's names), mutated; JSON (a subset of
/// YAML) or, a fifth of the time, raw mutated bytes.
fn craft_train_config(u: &mut Unstructured) -> Vec<u8> {
    const KEYS: &[&str] = &[
        "model",
        "train",
        "data",
        "fine_tune_type",
        "optimizer",
        "optimizer_config",
        "ns_steps",
        "beta_1",
        "relative_step",
        "num_layers",
        "batch_size",
        "iters",
        "val_batches",
        "learning_rate",
        "lr_schedule",
        "name",
        "arguments",
        "warmup",
        "warmup_init",
        "lora_parameters",
        "rank",
        "scale",
        "dropout",
        "keys",
        "steps_per_report",
        "steps_per_eval",
        "grad_accumulation_steps",
        "save_every",
        "max_seq_length",
        "seed",
        "objective",
        "beta",
        "ce_chunk_size",
        "segment_length",
        "max_grad_norm",
        "mask_prompt",
        "hf_dataset",
    ];
    let mut cfg: Value = json!({
        "model": "mlx_model",
        "train": true,
        "data": "data",
        "fine_tune_type": "lora",
        "optimizer": "adamw",
        "optimizer_config": {
            "adamw": {"betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01},
            "muon": {"momentum": 0.95, "nesterov": true, "ns_steps": 5},
            "adafactor": {"eps": [1e-30, 1e-3], "beta_1": null, "relative_step": true}
        },
        "num_layers": 4,
        "batch_size": 2,
        "iters": 100,
        "learning_rate": 1e-5,
        "lr_schedule": {"name": "cosine_decay", "arguments": [1e-5, 100, 0.0], "warmup": 10},
        "lora_parameters": {"rank": 8, "scale": 20.0, "dropout": 0.0, "keys": ["self_attn.q_proj"]},
        "grad_accumulation_steps": 1,
        "objective": "sft",
        "beta": 0.1,
    });
    mutate_json(u, &mut cfg, KEYS);
    let mut text = if chance(u, 50) {
        serde_json::to_string_pretty(&cfg).unwrap_or_default()
    } else {
        cfg.to_string()
    }
    .into_bytes();
    if chance(u, 20) {
        mutate_bytes(u, &mut text, 4);
    }
    text
}
