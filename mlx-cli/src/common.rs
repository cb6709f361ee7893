//! Flags shared by several subcommands, as clap argument groups (`#[command(flatten)]`), and
//! the helpers that turn them into engine options.

use std::io::Read;

use clap::Args;
use mlx_engine::generate::{
    cpu_decode_unsupported, graph_decode_unsupported, quantized_kv_start_from, CpuDecode,
    GenerateOptions, DEFAULT_QUANTIZED_KV_START,
};
use mlx_models::LanguageModel;

/// `--model`, `--dtype` and `--adapter-path`, defined beside the loader that reads them.
pub use crate::model::ModelArgs;

/// mlx-lm's `DEFAULT_PREFILL_STEP_SIZE`.
pub const DEFAULT_PREFILL_STEP_SIZE: usize = 2048;

/// The key-value cache and prefill flags of `generate_step`.
#[derive(Args, Clone, Debug)]
pub struct KvArgs {
    /// Set the maximum key-value cache size (a rotating cache keeping the first 4 tokens, for
    /// architectures without their own cache layout).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_kv_size: Option<u64>,
    /// Number of prompt tokens to process at a time.
    #[arg(long, default_value_t = DEFAULT_PREFILL_STEP_SIZE as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub prefill_step_size: u64,
    /// Number of bits for KV cache quantization (default: no quantization).
    #[arg(long, value_parser = clap::value_parser!(i32).range(2..=8))]
    pub kv_bits: Option<i32>,
    /// Group size for KV cache quantization.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(i32).range(1..))]
    pub kv_group_size: i32,
    /// With --kv-bits, start quantizing the KV cache from this step onwards.
    #[arg(long, default_value_t = DEFAULT_QUANTIZED_KV_START as i64, allow_negative_numbers = true)]
    pub quantized_kv_start: i64,
    /// How --kv-bits quantizes the KV cache: `affine` (mlx-lm's QuantizedKVCache) or
    /// `trellis` (2, 3 or 4 bits: each key and value vector trellis-coded, decoded for
    /// attention; the first 32 tokens and the last 256 read exactly; not in mlx-lm).
    #[arg(long, default_value = "affine", value_parser = ["affine", "trellis"])]
    pub kv_mode: String,
}

impl KvArgs {
    /// These flags applied to `opts`.
    pub fn apply(&self, opts: &mut GenerateOptions) {
        opts.max_kv_size = self.max_kv_size.map(|n| n as usize);
        opts.prefill_step_size = self.prefill_step_size as usize;
        opts.kv_bits = self.kv_bits;
        opts.kv_group_size = self.kv_group_size;
        opts.quantized_kv_start = quantized_kv_start_from(self.quantized_kv_start);
        opts.kv_mode = self.mode();
    }

    /// `--kv-mode` (clap admits only the known names).
    pub fn mode(&self) -> mlx_cache::KvMode {
        mlx_cache::KvMode::parse(&self.kv_mode).unwrap_or_default()
    }
}

/// The graph decoder's construction, as `--verbose` prints it (counted in the prompt's time).
pub fn graph_build_note(b: &mlx_engine::graph::BuildTimes) -> String {
    format!(
        "graph decoder built in {:.3} s (counted in the prompt time): kernels {:.3} s (NVRTC, or \
         the on-disk cache), weights {:.3} s, graph capture {:.3} s",
        b.kernels_s + b.weights_s + b.capture_s,
        b.kernels_s,
        b.weights_s,
        b.capture_s
    )
}

/// Which decoder runs the model.
#[derive(Args, Clone, Debug)]
pub struct DecoderArgs {
    /// `auto`: on a GPU (a `cuda` build), with the default `--dtype auto`, the graph decoder
    /// (our CUDA kernels, one CUDA graph a token) where it covers the model and options
    /// (llama, mistral, qwen2, smollm3 and like rows; bfloat16 or MLX affine 4/8-bit
    /// weights; greedy decoding on the device, sampling and logits processors on the host from
    /// its logits), else MLX; on the CPU backend, our multi-threaded SIMD CPU
    /// decoder where it covers the model and options (dense llama-family and Gemma 3 rows;
    /// float weights, MLX affine 2/4/8-bit or a GGUF's GGML blocks, which are then loaded as
    /// stored instead of dequantized), else MLX; `mlx`: MLX's own forward, the exact
    /// path whose outputs match mlx-lm's (as does any explicit `--dtype`); `cpu`, `graph`: that
    /// decoder, an error where it does not apply. Their logits differ from MLX's by float
    /// rounding.
    #[arg(long, default_value = "auto", value_parser = ["auto", "mlx", "cpu", "graph"])]
    pub decoder: String,
    /// Worker threads of the CPU decoder (default: all cores).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..4097))]
    pub threads: Option<u64>,
}

/// What [`DecoderArgs::pick`] chose: the engine options and a line saying which decoder runs
/// and, when `auto` fell back, why.
pub struct DecoderChoice {
    pub cpu: Option<CpuDecode>,
    /// The GPU graph decoder ([`GenerateOptions::graph_decode`]).
    pub graph: bool,
    pub name: &'static str,
    pub note: String,
}

impl DecoderChoice {
    /// These choices applied to `opts`.
    pub fn apply(&self, opts: &mut GenerateOptions) {
        opts.cpu_decode = self.cpu;
        opts.graph_decode = self.graph;
    }
}

impl DecoderArgs {
    /// Whether [`DecoderArgs::pick`] may choose the CPU decoder, as far as the flags alone
    /// say (`--decoder cpu`, or `auto` on the CPU backend with `--dtype auto`): then a GGUF
    /// file's k-quant weights are loaded as their blocks, which the CPU decoder reads in place
    /// (the MLX path, should `pick` still fall back to it, dequantizes them on use).
    pub fn may_pick_cpu(&self, dtype: &str) -> bool {
        let on_gpu = mlx_core::Device::default_device().is_ok_and(|d| d != mlx_core::Device::cpu());
        self.decoder == "cpu" || (self.decoder == "auto" && !on_gpu && dtype == "auto")
    }

    /// Whether a command loads a GGUF file's weights for the CPU decoder (GGML blocks kept as
    /// blocks, Q4_0 / Q8_0 biases left as the lazy product of their scales): where
    /// [`DecoderArgs::may_pick_cpu`] holds and the run does not stay on MLX's path under
    /// `auto` for another reason (`stays_on_mlx`: a draft model's exact speculation, a prompt
    /// cache's continuation), unless `--decoder cpu` asks for it.
    pub fn loads_gguf_blocks(&self, dtype: &str, stays_on_mlx: bool) -> bool {
        self.may_pick_cpu(dtype) && (self.decoder == "cpu" || !stays_on_mlx)
    }

    /// [`DecoderArgs::pick`], or the MLX path when `speculative` (drafts are verified there;
    /// `--decoder cpu|graph` is then an error).
    pub fn pick_unless_speculative(
        &self,
        speculative: bool,
        model: &dyn LanguageModel,
        opts: &GenerateOptions,
        dtype: &str,
        has_prompt_cache: bool,
        graph: Result<(), String>,
    ) -> Result<DecoderChoice, String> {
        if !speculative {
            return self.pick(model, opts, dtype, has_prompt_cache, graph);
        }
        if self.decoder == "cpu" || self.decoder == "graph" {
            return Err(format!(
                "--decoder {}: speculative decoding verifies drafts on the MLX path",
                self.decoder
            ));
        }
        Ok(DecoderChoice {
            cpu: None,
            graph: false,
            name: "mlx",
            note: "decoder: mlx (speculative decoding)".into(),
        })
    }

    /// The decoder for prompt lookup speculation: the CPU decoder where [`DecoderArgs::pick`]
    /// would choose it (`--decoder cpu`, or `auto` on the CPU backend with `--dtype auto`) and
    /// decoding is greedy (`greedy`: or why not), its drafts verified in batched passes
    /// ([`mlx_engine::cpu_spec`]); else the MLX path as [`DecoderArgs::pick_unless_speculative`].
    pub fn pick_for_prompt_lookup(
        &self,
        model: &dyn LanguageModel,
        opts: &GenerateOptions,
        dtype: &str,
        has_prompt_cache: bool,
        greedy: Result<(), String>,
    ) -> Result<DecoderChoice, String> {
        let on_gpu = mlx_core::Device::default_device().is_ok_and(|d| d != mlx_core::Device::cpu());
        let wants_cpu =
            self.decoder == "cpu" || (self.decoder == "auto" && !on_gpu && dtype == "auto");
        if !wants_cpu {
            return self.pick_unless_speculative(
                true,
                model,
                opts,
                dtype,
                has_prompt_cache,
                Ok(()),
            );
        }
        if let Err(why) = greedy {
            if self.decoder == "cpu" {
                return Err(format!(
                    "--decoder cpu: speculation on the CPU decoder is greedy only, not with {why}"
                ));
            }
            return Ok(DecoderChoice {
                cpu: None,
                graph: false,
                name: "mlx",
                note: format!(
                    "decoder: mlx (speculative decoding; the CPU decoder speculates only \
                     greedily, not with {why})"
                ),
            });
        }
        let mut c = self.pick(
            model,
            opts,
            dtype,
            has_prompt_cache,
            Err("speculative decoding".into()),
        )?;
        if c.cpu.is_some() {
            c.note
                .push_str(", prompt lookup drafts verified in batched passes");
        }
        Ok(c)
    }

    /// The decoder for `model` with `opts` (`dtype` is the `--dtype` flag; `has_prompt_cache`:
    /// a prompt cache is continued; `graph`: whether the command can use the graph decoder,
    /// or why not). `--decoder cpu|graph` where it cannot run is an error naming the reason.
    pub fn pick(
        &self,
        model: &dyn LanguageModel,
        opts: &GenerateOptions,
        dtype: &str,
        has_prompt_cache: bool,
        graph: Result<(), String>,
    ) -> Result<DecoderChoice, String> {
        let threads = self
            .threads
            .map_or_else(mlx_core::cpu::available_threads, |t| t as usize);
        let cpu = || DecoderChoice {
            cpu: Some(CpuDecode { threads }),
            graph: false,
            name: "cpu",
            note: format!(
                "decoder: cpu ({}, {threads} threads)",
                mlx_engine::cpu_decode::kernels()
            ),
        };
        let graph_choice = || DecoderChoice {
            cpu: None,
            graph: true,
            name: "graph",
            note: if opts.sampler.settings().temp != 0.0 || !opts.logits_processors.is_empty() {
                "decoder: graph (CUDA graph decoder, sampled on the host)".into()
            } else {
                "decoder: graph (CUDA graph decoder, greedy)".into()
            },
        };
        let mlx = |why: String| DecoderChoice {
            cpu: None,
            graph: false,
            name: "mlx",
            note: why,
        };
        let graph_why_not = || match &graph {
            Err(why) => Some(why.clone()),
            Ok(()) => graph_decode_unsupported(model, opts, has_prompt_cache),
        };
        let on_gpu = mlx_core::Device::default_device().is_ok_and(|d| d != mlx_core::Device::cpu());
        match self.decoder.as_str() {
            "mlx" => Ok(mlx("decoder: mlx (--decoder mlx)".into())),
            "cpu" => match cpu_decode_unsupported(model, opts, has_prompt_cache) {
                None => Ok(cpu()),
                Some(why) => Err(format!("--decoder cpu: {why}")),
            },
            "graph" => match graph_why_not() {
                None => Ok(graph_choice()),
                Some(why) => Err(format!("--decoder graph: {why}")),
            },
            _ if dtype != "auto" => Ok(mlx(format!(
                "decoder: mlx (auto: --dtype {dtype} asks for MLX's exact numerics)"
            ))),
            _ if on_gpu => match graph_why_not() {
                None => Ok(graph_choice()),
                Some(why) => Ok(mlx(format!(
                    "decoder: mlx (auto: the graph decoder does not apply: {why})"
                ))),
            },
            _ => match cpu_decode_unsupported(model, opts, has_prompt_cache) {
                None => Ok(cpu()),
                Some(why) => Ok(mlx(format!(
                    "decoder: mlx (auto: the CPU decoder does not apply: {why})"
                ))),
            },
        }
    }
}

/// `--max-tokens`: mlx-lm's `-1` (any negative number) is no limit.
pub fn max_tokens(n: i64) -> Option<usize> {
    usize::try_from(n).ok()
}

/// The prompt as mlx-lm's tools read it: `\n` and `\t` escapes unescaped, `-` reads all of
/// standard input.
pub fn read_prompt(prompt: &str) -> Result<String, String> {
    let text = prompt.replace("\\n", "\n").replace("\\t", "\t");
    if text != "-" {
        return Ok(text);
    }
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .read_to_end(&mut bytes)
        .map_err(|e| format!("--prompt -: reading standard input: {e}"))?;
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "--prompt -: standard input is not valid UTF-8 (first bad byte at offset {})",
            e.utf8_error().valid_up_to()
        )
    })
}

/// Writes a line to standard output, as `println!` does, but a write that fails (a closed
/// pipe: `mlx benchmark | head -2`) is an error naming standard output instead of
/// `println!`'s panic, so that the command stops there with exit status 1.
pub fn out(line: std::fmt::Arguments) -> Result<(), String> {
    use std::io::Write;
    writeln!(std::io::stdout().lock(), "{line}")
        .map_err(|e| format!("writing to standard output: {e}"))
}

/// `println!` for information a long job prints on its way (a quantizer's figures), except
/// that a failed write (a closed pipe: `mlx quant ... | head -1`) is ignored, so the job goes
/// on and saves its work where `println!` would panic.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}
pub(crate) use say;

/// mlx-lm's `str2bool`: anything but `false`/`f` (any case) is true.
pub fn str2bool(s: &str) -> Result<bool, String> {
    Ok(!matches!(s.to_lowercase().as_str(), "false" | "f"))
}

/// Checks the sampler flags mlx-lm would accept silently but that make no sense.
pub fn check_sampling(temp: f64, top_p: f64, min_p: f64, xtc_p: f64) -> Result<(), String> {
    if !temp.is_finite() || temp < 0.0 {
        return Err(format!("--temp must be a finite number >= 0, got {temp}"));
    }
    for (flag, v) in [
        ("--top-p", top_p),
        ("--min-p", min_p),
        ("--xtc-probability", xtc_p),
    ] {
        if !(0.0..=1.0).contains(&v) {
            return Err(format!("{flag} must be in [0, 1], got {v}"));
        }
    }
    Ok(())
}

/// Speculative decoding (`mlx_lm.generate --draft-model`, plus prompt lookup).
#[derive(Args, Clone, Debug, Default)]
pub struct SpecArgs {
    /// A model to be used for speculative decoding (a directory, .gguf file or Hub name; its
    /// tokenizer must have the model's vocabulary size). Runs on the MLX path (mlx-lm's
    /// speculation); on a CUDA build, greedy, with `--decoder auto` (on a GPU, `--dtype auto`)
    /// or `graph`, both models on the GPU graph decoder where both qualify (the output is
    /// plain greedy graph decoding's); with `--decoder cpu` both models on the CPU decoder
    /// (greedy only).
    #[arg(long, value_name = "PATH|NAME", conflicts_with_all = ["prompt_lookup_ngram", "mtp"])]
    pub draft_model: Option<String>,
    /// Number of tokens to draft when using speculative decoding (at most, a round): default
    /// 3 with a draft model or --mtp (mlx-lm's), 4 with --prompt-lookup-ngram.
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=64))]
    pub num_draft_tokens: Option<u64>,
    /// Speculate by prompt lookup: find the earlier occurrence (prompt and output so far) of
    /// the last N tokens (at least N: 1 is best on edits and summaries) whose preceding tokens
    /// match furthest back, and draft the tokens that followed it, at most the matched length
    /// and at most --num-draft-tokens, stopping where the output once left such a copy; the
    /// model verifies them in one pass, so greedy output is that of plain decoding.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=64), conflicts_with = "mtp")]
    pub prompt_lookup_ngram: Option<u64>,
    /// Speculate with the model's own multi-token-prediction layers (DeepSeek V3, GLM-4.5,
    /// Qwen3-Next and MiMo checkpoints carry them; mlx-lm drops them at load): they are
    /// loaded too and draft `--num-draft-tokens` tokens a step; greedy output is that of plain
    /// decoding.
    #[arg(long)]
    pub mtp: bool,
}

/// A loaded draft model, or prompt lookup.
pub enum SpecSource {
    Draft(Box<crate::model::Loaded>),
    Lookup(usize),
    /// The target's own MTP layers (loaded with it).
    Mtp,
}

impl SpecArgs {
    /// `--num-draft-tokens`, or its default: 4 for prompt lookup
    /// ([`mlx_engine::cpu_spec::LOOKUP_DRAFTS`]), 3 otherwise (mlx-lm's).
    pub fn num_draft_tokens(&self) -> usize {
        match self.num_draft_tokens {
            Some(n) => n as usize,
            None if self.prompt_lookup_ngram.is_some() => mlx_engine::cpu_spec::LOOKUP_DRAFTS,
            None => 3,
        }
    }

    pub fn active(&self) -> bool {
        self.draft_model.is_some() || self.prompt_lookup_ngram.is_some() || self.mtp
    }

    /// Loads the draft model (in the target's `--dtype`) and checks its vocabulary against
    /// `target`'s, as mlx-lm does; `None` without speculation.
    pub fn load(
        &self,
        target: &crate::model::Loaded,
        dtype: &str,
    ) -> Result<Option<SpecSource>, String> {
        if let Some(n) = self.prompt_lookup_ngram {
            return Ok(Some(SpecSource::Lookup(n as usize)));
        }
        if self.mtp {
            if target.model.mtp().is_none() {
                return Err(
                    "--mtp: the model was loaded without its multi-token-prediction layers".into(),
                );
            }
            return Ok(Some(SpecSource::Mtp));
        }
        let Some(path) = &self.draft_model else {
            return Ok(None);
        };
        let d = crate::model::load(&ModelArgs {
            model: Some(path.clone()),
            dtype: dtype.to_string(),
            adapter_path: None,
        })
        .map_err(|e| format!("--draft-model {path}: {e}"))?;
        mlx_engine::speculative::check_draft_tokenizer(&target.tokenizer, &d.tokenizer)
            .map_err(|e| format!("--draft-model {path}: {e}"))?;
        Ok(Some(SpecSource::Draft(Box::new(d))))
    }
}

impl SpecSource {
    /// The engine's drafter (a fresh draft cache).
    pub fn drafter(&self) -> mlx_engine::speculative::Drafter<'_> {
        match self {
            SpecSource::Draft(d) => mlx_engine::speculative::Drafter::Model {
                model: d.model.as_ref(),
                cache: None,
            },
            SpecSource::Lookup(n) => mlx_engine::speculative::Drafter::PromptLookup { ngram: *n },
            SpecSource::Mtp => mlx_engine::speculative::Drafter::Mtp,
        }
    }

    /// `--seed` as mlx-lm applies it with a draft model: seeded before both models are built,
    /// so the key is advanced by the target's draws and then the draft's.
    pub fn seed(&self, target: &crate::model::Loaded, seed: u64) -> Result<(), String> {
        let mut draws = target.draws;
        if let SpecSource::Draft(d) = self {
            draws += d.draws;
        }
        mlx_engine::seed::seed_as_mlx_lm(seed, draws).map_err(|e| e.to_string())
    }

    /// The acceptance line `--verbose` prints.
    pub fn report(stats: &mlx_engine::speculative::SpecStats) -> String {
        format!(
            "Speculative: {} of {} draft tokens accepted ({:.1}%), {} verification passes",
            stats.accepted,
            stats.drafted,
            100.0 * stats.acceptance(),
            stats.rounds
        )
    }
}
