//! `mlx convert` (as `mlx_lm.convert`): a model directory to an MLX model directory, cast,
//! quantized (`-q`, `--q-bits`, `--q-group-size`, `--q-mode`, `--quant-predicate`) or
//! dequantized (`-d`), over `mlx_models::convert`. A progress bar counts tensors.

use std::io::IsTerminal;
use std::path::Path;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mlx_core::cpu::trellis::TrellisCode;
use mlx_core::quantized::QuantMode;
use mlx_models::convert::{
    convert, is_gguf, ConvertOptions, Progress, CONVERSION_DTYPES, QUANT_RECIPES,
};

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// Path to the model: a local model directory (config.json and safetensors).
    #[arg(long = "hf-path", visible_alias = "model")]
    pub hf_path: String,
    /// Path to save the MLX model.
    #[arg(long, default_value = "mlx_model")]
    pub mlx_path: String,
    /// Generate a quantized model.
    #[arg(short = 'q', long)]
    pub quantize: bool,
    /// Group size for quantization (default: the mode's, affine 64).
    #[arg(long)]
    pub q_group_size: Option<i32>,
    /// Bits per weight for quantization (default: the mode's, affine 4).
    #[arg(long)]
    pub q_bits: Option<i32>,
    /// The quantization mode.
    #[arg(long, default_value = "affine", value_parser = ["affine", "mxfp4", "nvfp4", "mxfp8", "trellis"])]
    pub q_mode: String,
    /// `--q-mode trellis`: the trellis state's bits L (k + 1 to 16; the encoder's time grows
    /// as 2^L).
    #[arg(long, default_value_t = mlx_models::config::TRELLIS_DEFAULTS.2)]
    pub q_trellis_l: u32,
    /// `--q-mode trellis`: the seed of the random Hadamard incoherence (stored in the config).
    #[arg(long, default_value_t = 0)]
    pub q_seed: u64,
    /// `--q-mode trellis`: the code the states decode to: `1mad` (QTIP's), `1mad8` (1MAD
    /// rounded to int8, for the CPU decoder's int8 kernel: needs `--q-trellis-l` 8 or less) or
    /// `1mad8h` (1mad8's 256 codes indexed by the state's top byte plus its bottom byte:
    /// `--q-trellis-l` 9 to 16) or `1mad8s` (as 1mad8h, the top byte through the AES S-box) or
    /// `gauss8s` (1mad8s's index into a stratified 256-entry Gaussian table, L 9 to 16) or
    /// `gauss7s` (its 128-entry twin: the CPU decoder's int8 kernel takes one lookup a 64
    /// weights fewer). Default: at 3 bits in blocks of 64 (`--q-group-size`) with
    /// `--q-trellis-l` 9 to 16, `gauss7s`, with the value projections in `1mad` unless
    /// `--q-trellis-v-code` says otherwise (the 3-bit recipe that meets both the quality and
    /// the CPU speed targets, results/quant/2026-12-06-s35-trelq/); otherwise `1mad`.
    #[arg(
        long,
        value_parser = ["1mad", "1mad8", "1mad8h", "1mad8s", "gauss8s", "gauss7s"]
    )]
    pub q_trellis_code: Option<String>,
    /// `--q-mode trellis`: the code of the attention value projections (`*.v_proj`), where it
    /// should differ from `--q-trellis-code`'s (each such linear's own config entry records
    /// it). `--q-trellis-code gauss7s --q-trellis-v-code 1mad` is the 3-bit recipe that keeps
    /// gauss7s's CPU speed and 1mad's quality (results/quant/2026-12-06-s35-trelq/). Fused
    /// q/k/v projections keep `--q-trellis-code`'s code. Default: `1mad` where neither code is
    /// given at the 3-bit recipe's shape (above), else the other linears' code.
    #[arg(
        long,
        value_parser = ["1mad", "1mad8", "1mad8h", "1mad8s", "gauss8s", "gauss7s"]
    )]
    pub q_trellis_v_code: Option<String>,
    /// `--q-mode trellis`: a `.safetensors` file of `<linear path>.hessian` (each linear's
    /// input second moment on calibration text, `xtask/quant/trellis_hessians.py`): those
    /// linears are rounded by LDLQ instead of plain Viterbi.
    #[arg(long)]
    pub q_hessians: Option<std::path::PathBuf>,
    /// `--q-mode trellis`: a `.safetensors` file of `<linear path>.hessian` like
    /// `--q-hessians`' but from HELD-OUT text (`xtask/quant/trellis_hessians_np.py` on text
    /// that is not the calibration text): each linear is then coded under
    /// `--q-seed-candidates` sign seeds (`--q-seed`, `--q-seed` + 1, ...) and keeps the one
    /// with the least output error on that text (recorded in the linear's config entry).
    #[arg(long)]
    pub q_select_hessians: Option<std::path::PathBuf>,
    /// `--q-mode trellis` with `--q-select-hessians`: the sign seeds each linear tries
    /// (default 4; 1 turns the choice off: one seed, as without `--q-select-hessians`). The
    /// encoding time grows with it.
    #[arg(long)]
    pub q_seed_candidates: Option<usize>,
    /// Mixed-bit quantization recipe.
    #[arg(long, value_parser = QUANT_RECIPES)]
    pub quant_predicate: Option<String>,
    /// Type to save the non-quantized parameters. Defaults to config.json's `torch_dtype` or
    /// the current model weights dtype.
    #[arg(long, value_parser = CONVERSION_DTYPES)]
    pub dtype: Option<String>,
    /// Dequantize a quantized model.
    #[arg(short = 'd', long)]
    pub dequantize: bool,
    /// Accepted for mlx-lm compatibility (nothing is run from the model directory).
    #[arg(long)]
    pub trust_remote_code: bool,
}

impl ConvertArgs {
    /// The trellis codes `--q-mode trellis` uses: the linears' and the value projections'
    /// (`None`: the linears'). At 3 bits in blocks of 64 with L 9 to 16 (the 3-bit recipe's
    /// shape, where both codes take the kernels' same path on CUDA) the linears default to
    /// gauss7s and, where `--q-trellis-code` is not given either, the value projections to
    /// 1mad; every other shape defaults to 1mad. A code given is used as given.
    pub fn trellis_codes(&self) -> (TrellisCode, Option<TrellisCode>) {
        let code = |name: &Option<String>| name.as_deref().and_then(TrellisCode::from_name);
        let (g, b, _) = mlx_models::config::TRELLIS_DEFAULTS;
        let recipe = self.q_bits.unwrap_or(b) == 3
            && self.q_group_size.unwrap_or(g) == 64
            && (9..=16).contains(&self.q_trellis_l);
        let (given, given_v) = (code(&self.q_trellis_code), code(&self.q_trellis_v_code));
        let value = match (given, given_v) {
            (_, Some(v)) => Some(v),
            (None, None) if recipe => Some(TrellisCode::Mad),
            _ => None,
        };
        let linears = given.unwrap_or(if recipe {
            TrellisCode::Gauss7S
        } else {
            TrellisCode::Mad
        });
        (linears, value)
    }

    /// The library's options (the mode name is one clap accepted).
    pub fn options(&self) -> Result<ConvertOptions, String> {
        let (trellis_code, trellis_value_code) = self.trellis_codes();
        let trellis = (self.q_mode == "trellis").then_some(mlx_models::config::TrellisParams {
            trellis_l: self.q_trellis_l,
            seed: self.q_seed,
            trellis_code,
        });
        let q_mode = if trellis.is_some() {
            QuantMode::Affine
        } else {
            QuantMode::from_name(&self.q_mode)
                .ok_or_else(|| format!("--q-mode: unknown mode `{}`", self.q_mode))?
        };
        if self.quantize && self.dequantize {
            return Err("Choose either quantize or dequantize, not both.".into());
        }
        if let (None, Some(c)) = (&trellis, &self.q_trellis_code) {
            return Err(format!(
                "--q-trellis-code {c}: only with --q-mode trellis (got --q-mode {})",
                self.q_mode
            ));
        }
        if let (None, Some(v)) = (&trellis, &self.q_trellis_v_code) {
            return Err(format!(
                "--q-trellis-v-code {v}: only with --q-mode trellis (got --q-mode {})",
                self.q_mode
            ));
        }
        if trellis.is_none()
            && (self.q_select_hessians.is_some() || self.q_seed_candidates.is_some())
        {
            return Err(format!(
                "--q-select-hessians/--q-seed-candidates: only with --q-mode trellis (got \
                 --q-mode {})",
                self.q_mode
            ));
        }
        if let Some(n) = self.q_seed_candidates {
            let max = mlx_models::layers::trellis::MAX_SEED_CANDIDATES;
            if n == 0 || n > max {
                return Err(format!(
                    "--q-seed-candidates {n}: from 1 (1: no seed choice) to {max}"
                ));
            }
            if self.q_select_hessians.is_none() {
                return Err(format!(
                    "--q-seed-candidates {n}: only with --q-select-hessians (the held-out \
                     Hessians that choose)"
                ));
            }
        }
        if self.quant_predicate.is_some() && (q_mode != QuantMode::Affine || trellis.is_some()) {
            return Err("Quant predicates only support 'affine' quantization.".into());
        }
        if let (true, Some(t)) = (self.quantize, trellis) {
            let (g, b, _) = mlx_models::config::TRELLIS_DEFAULTS;
            mlx_models::config::QuantParams {
                group_size: self.q_group_size.unwrap_or(g),
                bits: self.q_bits.unwrap_or(b),
                mode: "trellis".into(),
                trellis: Some(t),
            }
            .validate()
            .map_err(|m| format!("--q-bits/--q-group-size/--q-trellis-l: {m}"))?;
        } else if self.quantize {
            let (g, b) = match q_mode {
                QuantMode::Affine => (64, 4),
                QuantMode::Mxfp4 => (32, 4),
                QuantMode::Nvfp4 => (16, 4),
                QuantMode::Mxfp8 => (32, 8),
            };
            q_mode
                .check(self.q_group_size.unwrap_or(g), self.q_bits.unwrap_or(b))
                .map_err(|m| format!("--q-bits/--q-group-size: {m}"))?;
        }
        Ok(ConvertOptions {
            extra_files: Vec::new(),
            quantize: self.quantize,
            q_group_size: self.q_group_size,
            q_bits: self.q_bits,
            q_mode,
            quant_predicate: self.quant_predicate.clone(),
            dtype: self.dtype.clone(),
            dequantize: self.dequantize,
            trellis,
            trellis_hessians: self.q_hessians.clone(),
            trellis_select_hessians: self.q_select_hessians.clone(),
            trellis_seed_candidates: self.q_seed_candidates,
            trellis_value_code: trellis.and(trellis_value_code),
            per_module: None,
            keep_dtype: false,
        })
    }

    /// Checks that need no model: the options, the source directory, a free output path.
    pub fn check(&self) -> Result<(), String> {
        self.options()?;
        let src = Path::new(&self.hf_path);
        if !is_gguf(src) && !src.join("config.json").is_file() {
            return Err(format!(
                "--hf-path {}: not a model directory (no config.json) nor a .gguf file; Hub \
                 names are not fetched by `mlx convert`",
                self.hf_path
            ));
        }
        if Path::new(&self.mlx_path).exists() {
            return Err(format!(
                "Cannot save to the path {} as it already exists. Please delete the \
                 file/directory or specify a new path to save to.",
                self.mlx_path
            ));
        }
        Ok(())
    }
}

/// Runs the conversion, with `[INFO]` lines as mlx-lm prints them and a bar per stage.
pub fn run(a: &ConvertArgs) -> Result<(), String> {
    let mut opts = a.options()?;
    if is_gguf(Path::new(&a.hf_path)) {
        opts.extra_files = gguf_tokenizer_files(Path::new(&a.hf_path))
            .map_err(|e| format!("{}: {e}", a.hf_path))?;
    }
    let mut progress = ProgressView::new("[INFO] ");
    let mut on_progress = |p: Progress<'_>| progress.show(p);
    let report = convert(
        Path::new(&a.hf_path),
        Path::new(&a.mlx_path),
        &opts,
        &mut on_progress,
    )
    .map_err(|e| format!("{}: {e}", a.hf_path))?;
    progress.finish();
    eprintln!(
        "[mlx] wrote {} tensors to {} ({})",
        report.tensors,
        a.mlx_path,
        report.files.join(", ")
    );
    Ok(())
}

/// `tokenizer.json` and `tokenizer_config.json` for a GGUF file's tokenizer (its metadata
/// built into a Hugging Face tokenizer as `mlx generate` builds it; the config names the
/// special tokens and holds the chat template).
fn gguf_tokenizer_files(path: &Path) -> Result<Vec<(String, Vec<u8>)>, String> {
    let header = mlx_core::io::read_gguf_header(path).map_err(|e| e.to_string())?;
    if !header.metadata.contains_key("tokenizer.ggml.tokens") {
        eprintln!(
            "[mlx] {}: no tokenizer in the GGUF metadata; none written",
            path.display()
        );
        return Ok(Vec::new());
    }
    let named = |e: mlx_engine::tokenizer::TokenizerError| format!("{}: {e}", path.display());
    let data = mlx_engine::tokenizer_gguf::tokenizer_data(&header.metadata).map_err(named)?;
    let tok = data.build().map_err(named)?;
    let json = tok.to_hf_json().map_err(|e| e.to_string())?;
    let token = |id: Option<u32>| {
        id.and_then(|i| data.tokens.get(i as usize))
            .map_or(serde_json::Value::Null, |t| {
                serde_json::Value::from(t.clone())
            })
    };
    let mut config = serde_json::Map::new();
    config.insert("add_bos_token".into(), data.add_bos.unwrap_or(false).into());
    config.insert("add_eos_token".into(), data.add_eos.unwrap_or(false).into());
    config.insert("bos_token".into(), token(data.bos_id));
    if let Some(t) = &data.chat_template {
        config.insert("chat_template".into(), t.clone().into());
    }
    config.insert("clean_up_tokenization_spaces".into(), false.into());
    config.insert("eos_token".into(), token(data.eos_id));
    if data.pad_id.is_some() {
        config.insert("pad_token".into(), token(data.pad_id));
    }
    config.insert("tokenizer_class".into(), "PreTrainedTokenizerFast".into());
    if data.unk_id.is_some() {
        config.insert("unk_token".into(), token(data.unk_id));
    }
    let config = serde_json::to_string_pretty(&serde_json::Value::Object(config))
        .map_err(|e| e.to_string())?;
    Ok(vec![
        ("tokenizer.json".into(), json.into_bytes()),
        ("tokenizer_config.json".into(), config.into_bytes()),
    ])
}

/// How `convert` and `quant` show a conversion's [`Progress`] on the terminal: info lines on
/// standard output (after `info_prefix`), and a bar on standard error per stage when it is a
/// terminal, advanced per tensor.
pub(crate) struct ProgressView {
    info_prefix: &'static str,
    tty: bool,
    bar: Option<ProgressBar>,
}

impl ProgressView {
    pub(crate) fn new(info_prefix: &'static str) -> ProgressView {
        ProgressView {
            info_prefix,
            tty: std::io::stderr().is_terminal(),
            bar: None,
        }
    }

    pub(crate) fn show(&mut self, p: Progress<'_>) {
        match p {
            Progress::Info(line) => {
                self.finish();
                // Information only: a closed stdout (`mlx convert ... | head -1`) does not
                // stop the conversion (`println!` panicked there).
                crate::common::say!("{}{line}", self.info_prefix);
            }
            Progress::Stage(name, total) => {
                self.finish();
                if self.tty && total > 0 {
                    let pb = ProgressBar::with_draw_target(
                        Some(total as u64),
                        ProgressDrawTarget::stderr(),
                    );
                    if let Ok(style) = ProgressStyle::with_template(
                        "[mlx] {prefix} [{bar:30}] {pos}/{len} {wide_msg}",
                    ) {
                        pb.set_style(style.progress_chars("=> "));
                    }
                    pb.set_prefix(name.to_string());
                    self.bar = Some(pb);
                }
            }
            Progress::Tensor(name) => {
                if let Some(b) = &self.bar {
                    b.set_message(name.to_string());
                    b.inc(1);
                }
            }
        }
    }

    /// Clears the current stage's bar.
    pub(crate) fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        a: ConvertArgs,
    }

    fn codes(extra: &[&str]) -> (TrellisCode, Option<TrellisCode>) {
        let mut args = vec!["convert", "--hf-path", "src", "-q", "--q-mode", "trellis"];
        args.extend_from_slice(extra);
        Cmd::try_parse_from(args).unwrap().a.trellis_codes()
    }

    #[test]
    fn the_3_bit_recipe_is_the_default_only_at_its_shape() {
        use TrellisCode::{Gauss7S, Mad, Mad8H};
        let recipe = (Gauss7S, Some(Mad));
        assert_eq!(codes(&["--q-bits", "3"]), recipe);
        assert_eq!(codes(&["--q-bits", "3", "--q-group-size", "64"]), recipe);
        assert_eq!(codes(&["--q-bits", "3", "--q-trellis-l", "9"]), recipe);
        // Other shapes (gauss7s's blocks, the CUDA kernels' paths, other bits) take 1mad.
        for other in [
            &["--q-bits", "3", "--q-group-size", "32"][..],
            &["--q-bits", "3", "--q-group-size", "256"],
            &["--q-bits", "3", "--q-trellis-l", "8"],
            &["--q-bits", "2"],
            &["--q-bits", "4"],
            &[],
        ] {
            assert_eq!(codes(other), (Mad, None), "{other:?}");
        }
        // A code given is used as given; the other keeps its default.
        assert_eq!(
            codes(&["--q-bits", "3", "--q-trellis-code", "1mad"]),
            (Mad, None)
        );
        assert_eq!(
            codes(&["--q-bits", "3", "--q-trellis-v-code", "1mad8h"]),
            (Gauss7S, Some(Mad8H))
        );
        assert_eq!(
            codes(&["--q-bits", "2", "--q-trellis-v-code", "1mad8h"]),
            (Mad, Some(Mad8H))
        );
    }
}
