//! The command line's parse-and-validate layer: [`parse`] runs the real clap parser over an
//! argument vector, then every check that needs neither a model nor the network (numbers in
//! range, JSON flags well formed, the files the flags name: a prompt-cache file is loaded, a
//! training config file resolved, an `info` directory described). The `mlx` binary runs it
//! before anything else; `mlx-fuzz`'s `argv` target runs it in-process on mutated argument
//! vectors. Nothing here reads standard input, prints, loads a model or fetches.

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use mlx_cache::{KvMode, QuantizedKVCache};
use mlx_models::load::ModelInfo;

use crate::cache_prompt::CachePromptArgs;
use crate::chat::ChatArgs;
use crate::common::{self, KvArgs, ModelArgs};
use crate::completions::CompletionsArgs;
use crate::embed::EmbedArgs;
use crate::generate::{self, CacheFile, GenerateArgs};
use crate::info::InfoArgs;
use crate::manage::ManageArgs;
use crate::models::ModelsArgs;
use crate::{model, Cli, Command};

/// A command line that parsed and passed every check, with what the checks loaded.
pub enum Checked {
    Generate(Box<GenerateArgs>, Option<CacheFile>),
    Chat(Box<ChatArgs>),
    CachePrompt(Box<CachePromptArgs>),
    Serve(Box<mlx_server::ServeArgs>),
    Train(Box<mlx_train::cli::TrainArgs>),
    Fuse(Box<mlx_train::cli::FuseArgs>),
    Models(ModelsArgs),
    Manage(ManageArgs),
    Completions(CompletionsArgs),
    Info(InfoArgs, Box<ModelInfo>),
    Embed(Box<EmbedArgs>),
    Launch(Box<crate::launch::LaunchArgs>),
    Convert(Box<crate::convert::ConvertArgs>),
    Perplexity(Box<crate::perplexity::PerplexityArgs>),
    Benchmark(Box<crate::benchmark::BenchmarkArgs>),
    Quant(Box<crate::quant::QuantArgs>),
}

impl Checked {
    /// The subcommand's name.
    pub fn subcommand(&self) -> &'static str {
        match self {
            Checked::Generate(..) => "generate",
            Checked::Chat(_) => "chat",
            Checked::CachePrompt(_) => "cache-prompt",
            Checked::Serve(_) => "serve",
            Checked::Train(_) => "train",
            Checked::Fuse(_) => "fuse",
            Checked::Models(_) => "models",
            Checked::Manage(_) => "manage",
            Checked::Completions(_) => "completions",
            Checked::Info(..) => "info",
            Checked::Embed(_) => "embed",
            Checked::Launch(_) => "launch",
            Checked::Convert(_) => "convert",
            Checked::Perplexity(_) => "perplexity",
            Checked::Benchmark(_) => "benchmark",
            Checked::Quant(_) => "quant",
        }
    }
}

/// Why a command line does not run.
#[derive(Debug)]
pub enum CliError {
    /// clap's outcome: a usage error (exit 2), or `--help` / `--version` (exit 0, stdout).
    Clap(clap::Error),
    /// An argument that is not UTF-8 (exit 2).
    NotUtf8(String),
    /// A check failed (exit 1).
    Invalid(String),
}

impl CliError {
    /// The message, as plain text (clap's rendered without colour).
    pub fn message(&self) -> String {
        match self {
            CliError::Clap(e) => e.render().to_string(),
            CliError::NotUtf8(m) | CliError::Invalid(m) => format!("error: {m}"),
        }
    }

    /// The exit status.
    pub fn code(&self) -> u8 {
        match self {
            CliError::Clap(e) => u8::try_from(e.exit_code()).unwrap_or(2),
            CliError::NotUtf8(_) => 2,
            CliError::Invalid(_) => 1,
        }
    }

    /// Prints the message where it belongs and returns the exit status.
    pub fn report(&self) -> ExitCode {
        match self {
            // clap writes help to stdout, errors to stderr, with colour on a terminal.
            CliError::Clap(e) => {
                let _ = e.print();
            }
            e => eprintln!("{}", e.message()),
        }
        ExitCode::from(self.code())
    }
}

/// The first argument (after the program name) that is not valid UTF-8, as an error naming it
/// (clap's own message does not say which one).
fn check_utf8(args: &[OsString]) -> Result<(), CliError> {
    for (i, a) in args.iter().enumerate().skip(1) {
        if a.to_str().is_none() {
            return Err(CliError::NotUtf8(format!(
                "argument {i} ({:?}) is not valid UTF-8; arguments must be UTF-8 text",
                a.to_string_lossy()
            )));
        }
    }
    Ok(())
}

/// Parses `args` (the program name first) with clap and checks the result.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Checked, CliError> {
    let args: Vec<OsString> = args.into_iter().collect();
    check_utf8(&args)?;
    let cli = Cli::try_parse_from(&args).map_err(CliError::Clap)?;
    check(cli.command).map_err(CliError::Invalid)
}

/// Every check of a parsed command that needs no model and no network.
pub fn check(c: Command) -> Result<Checked, String> {
    Ok(match c {
        Command::Generate(a) => {
            check_model(&a.model)?;
            check_max_tokens(a.max_tokens)?;
            check_sampling(a.temp, a.top_p, a.min_p, a.xtc_probability, a.xtc_threshold)?;
            check_kv(&a.kv)?;
            if a.prompt_ids.as_ref().is_some_and(Vec::is_empty) {
                return Err("--prompt-ids: give at least one token id".into());
            }
            if a.stop.iter().any(String::is_empty) {
                return Err("--stop: an empty stop string would end every reply at once".into());
            }
            if a.extra_eos_token.iter().any(String::is_empty) {
                return Err("--extra-eos-token: the token must not be empty".into());
            }
            generate::template_kwargs(&a)?;
            if let Some(p) = &a.json_schema {
                generate::read_json_schema(p)?;
            }
            let cache_file = a
                .prompt_cache_file
                .as_deref()
                .map(|p| generate::load_cache_file(p, &a))
                .transpose()?;
            Checked::Generate(Box::new(a), cache_file)
        }
        Command::Chat(a) => {
            check_model(&a.model)?;
            check_max_tokens(a.max_tokens)?;
            check_sampling(a.temp, a.top_p, 0.0, a.xtc_probability, a.xtc_threshold)?;
            if let Some(p) = &a.json_schema {
                generate::read_json_schema(p)?;
            }
            Checked::Chat(Box::new(a))
        }
        Command::CachePrompt(a) => {
            check_model(&a.model)?;
            check_kv(&a.kv)?;
            check_output_file("--prompt-cache-file", &a.prompt_cache_file)?;
            if a.eos_token.as_deref() == Some("") {
                return Err("--eos-token: the token must not be empty".into());
            }
            Checked::CachePrompt(Box::new(a))
        }
        Command::Serve(a) => {
            model::model_path(a.model.as_deref())?;
            check_adapter_path(a.adapter_path.as_deref())?;
            check_serve(&a)?;
            Checked::Serve(Box::new(a))
        }
        Command::Train(a) => {
            a.resolve()
                .and_then(|c| c.validate())
                .map_err(|e| e.to_string())?;
            Checked::Train(Box::new(a))
        }
        Command::Fuse(a) => {
            for (flag, p) in [("--model", &a.model), ("--adapter-path", &a.adapter_path)] {
                if !Path::new(p).exists() {
                    return Err(format!("{flag} {p:?}: no such file or directory"));
                }
            }
            Checked::Fuse(Box::new(a))
        }
        Command::Models(a) => Checked::Models(a),
        Command::Manage(a) => {
            if !a.scan && !a.delete {
                return Err("mlx manage: give --scan or --delete".into());
            }
            Checked::Manage(a)
        }
        Command::Completions(a) => Checked::Completions(a),
        Command::Info(a) => {
            let info = mlx_engine::load::model_info(Path::new(&a.model))
                .map_err(|e| format!("{}: {e}", a.model))?;
            Checked::Info(a, Box::new(info))
        }
        Command::Embed(a) => {
            check_model(&a.model)?;
            Checked::Embed(Box::new(a))
        }
        Command::Launch(a) => {
            crate::launch::check_args(&a)?;
            Checked::Launch(Box::new(a))
        }
        Command::Convert(a) => {
            a.check()?;
            Checked::Convert(Box::new(a))
        }
        Command::Perplexity(a) => {
            a.check()?;
            Checked::Perplexity(Box::new(a))
        }
        Command::Benchmark(a) => {
            a.check()?;
            Checked::Benchmark(Box::new(a))
        }
        Command::Quant(a) => {
            a.check()?;
            Checked::Quant(Box::new(a))
        }
    })
}

fn check_model(m: &ModelArgs) -> Result<(), String> {
    model::model_path(m.model.as_deref())?;
    check_adapter_path(m.adapter_path.as_deref())
}

/// `--max-tokens 0`, which mlx-lm refuses only once the model is loaded (`mlx chat`: once the
/// first message is typed), refused before anything is loaded, with mlx-lm's words.
fn check_max_tokens(n: i64) -> Result<(), String> {
    if n == 0 {
        return Err(
            "--max-tokens 0: Maximum number of tokens must be non-zero (use -1 for no limit)."
                .into(),
        );
    }
    Ok(())
}

fn check_adapter_path(dir: Option<&str>) -> Result<(), String> {
    match dir {
        Some(dir) if !Path::new(dir).is_dir() => {
            Err(format!("--adapter-path {dir:?}: not a directory"))
        }
        _ => Ok(()),
    }
}

/// The sampler flags mlx-lm would accept silently but that make no sense, and the XTC
/// threshold that mlx-lm refuses when XTC is on.
fn check_sampling(temp: f64, top_p: f64, min_p: f64, xtc_p: f64, xtc_t: f64) -> Result<(), String> {
    common::check_sampling(temp, top_p, min_p, xtc_p)?;
    if xtc_p > 0.0 && !(0.0..=0.5).contains(&xtc_t) {
        return Err(format!(
            "--xtc-threshold must be in [0, 0.5] when --xtc-probability is above 0, got {xtc_t}"
        ));
    }
    Ok(())
}

/// `--kv-bits`, `--kv-group-size` and `--kv-mode` as the quantized cache checks them.
fn check_kv(kv: &KvArgs) -> Result<(), String> {
    check_kv_mode(kv.mode(), kv.kv_bits, kv.kv_group_size)
}

fn check_kv_mode(mode: KvMode, bits: Option<i32>, group_size: i32) -> Result<(), String> {
    match (bits, mode) {
        (Some(bits), KvMode::Affine) => {
            QuantizedKVCache::new(group_size, bits)
                .map_err(|e| format!("--kv-bits {bits} --kv-group-size {group_size}: {e}"))?;
        }
        (Some(bits), KvMode::Trellis) => {
            mode.check(group_size, bits)
                .map_err(|e| format!("--kv-bits {bits} --kv-mode trellis: {e}"))?;
        }
        (None, KvMode::Trellis) => {
            return Err("--kv-mode trellis needs --kv-bits (2, 3 or 4)".into());
        }
        (None, KvMode::Affine) => {}
    }
    Ok(())
}

/// A file to be written: its directory must exist and it must not be a directory.
fn check_output_file(flag: &str, p: &str) -> Result<(), String> {
    let path = Path::new(p);
    if p.is_empty() || path.is_dir() {
        return Err(format!("{flag} {p:?}: not a file name"));
    }
    let parent = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !parent.is_dir() {
        return Err(format!(
            "{flag} {p:?}: the directory {} does not exist",
            parent.display()
        ));
    }
    Ok(())
}

/// `mlx serve`'s KV cache options and `--max-n` (issue #36's block of server options).
fn check_serve_cache(a: &mlx_server::ServeArgs) -> Result<(), String> {
    let mode = KvMode::parse(&a.kv_mode).map_err(|e| format!("--kv-mode: {e}"))?;
    check_kv_mode(mode, a.kv_bits, a.kv_group_size)?;
    if a.max_kv_size == Some(0) {
        return Err("--max-kv-size must be at least 1".into());
    }
    if a.max_n == 0 {
        return Err("--max-n must be at least 1".into());
    }
    Ok(())
}

fn check_serve(a: &mlx_server::ServeArgs) -> Result<(), String> {
    check_serve_cache(a)?;
    // The ranges each request is held to (`mlx-server`'s request checks), so that a default
    // the server would refuse on every request is refused at start.
    if !(0.0..=100.0).contains(&a.temp) {
        return Err(format!("--temp must be in [0, 100], got {}", a.temp));
    }
    for (flag, v) in [("--top-p", a.top_p), ("--min-p", a.min_p)] {
        if !(0.0..=1.0).contains(&v) {
            return Err(format!("{flag} must be in [0, 1], got {v}"));
        }
    }
    if a.top_k < 0 {
        return Err(format!("--top-k must be 0 or more, got {}", a.top_k));
    }
    for (flag, v) in [
        ("--max-batch", a.max_batch),
        ("--max-tokens-limit", a.max_tokens_limit),
        ("--prefill-step-size", a.prefill_step_size),
        ("--max-context", a.max_context),
        ("--max-request-tokens", a.max_request_tokens),
        ("--max-embedding-inputs", a.max_embedding_inputs),
        ("--max-embedding-input-tokens", a.max_embedding_input_tokens),
        ("--max-connections", a.max_connections),
    ] {
        if v == 0 {
            return Err(format!("{flag} must be at least 1"));
        }
    }
    match serde_json::from_str::<serde_json::Value>(&a.chat_template_args) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        _ => Err(format!(
            "--chat-template-args must be a JSON object, got {:?}",
            a.chat_template_args
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<&'static str, String> {
        let argv = std::iter::once("mlx")
            .chain(args.iter().copied())
            .map(OsString::from);
        parse(argv).map(|c| c.subcommand()).map_err(|e| e.message())
    }

    #[test]
    fn valid_command_lines_pass() {
        assert_eq!(run(&["models"]), Ok("models"));
        assert_eq!(run(&["generate", "--temp", "0.7"]), Ok("generate"));
        assert_eq!(run(&["serve", "--port", "0"]), Ok("serve"));
    }

    #[test]
    fn bad_values_are_refused_with_the_flag_named() {
        for (args, flag) in [
            (&["generate", "--temp", "nan"][..], "--temp"),
            (&["generate", "--temp", "inf"], "--temp"),
            (&["chat", "--top-p", "2"], "--top-p"),
            (
                &[
                    "generate",
                    "--xtc-probability",
                    "0.5",
                    "--xtc-threshold",
                    "0.9",
                ],
                "--xtc-threshold",
            ),
            (
                &["generate", "--kv-bits", "3", "--kv-group-size", "7"],
                "--kv-bits",
            ),
            (&["generate", "--stop", ""], "--stop"),
            (&["generate", "--max-tokens", "0"], "--max-tokens 0"),
            (&["chat", "-m", "0"], "--max-tokens 0"),
            (
                &["generate", "--chat-template-config", "[1]"],
                "--chat-template-config",
            ),
            (&["serve", "--temp", "nan"], "--temp"),
            (&["serve", "--max-batch", "0"], "--max-batch"),
            (&["serve", "--kv-bits", "7"], "--kv-bits"),
            (&["serve", "--max-kv-size", "0"], "--max-kv-size"),
            (&["serve", "--max-n", "0"], "--max-n"),
            (
                &["serve", "--max-request-tokens", "0"],
                "--max-request-tokens",
            ),
            (
                &["serve", "--chat-template-args", "{"],
                "--chat-template-args",
            ),
            (
                &[
                    "cache-prompt",
                    "-p",
                    "x",
                    "--prompt-cache-file",
                    "/no/such/dir/c.safetensors",
                ],
                "--prompt-cache-file",
            ),
            (&["fuse", "--model", "/no/such/model"], "--model"),
        ] {
            let e = run(args).expect_err(&format!("{args:?} passed"));
            assert!(e.contains(flag), "{args:?}: {e}");
        }
    }

    #[test]
    fn non_utf8_arguments_are_named() {
        use std::os::unix::ffi::OsStringExt;
        let argv = vec![
            OsString::from("mlx"),
            OsString::from("generate"),
            OsString::from_vec(vec![0x2d, 0x2d, 0xff]),
        ];
        let e = parse(argv).err().map(|e| (e.code(), e.message()));
        assert!(
            matches!(&e, Some((2, m)) if m.contains("argument 2")),
            "{e:?}"
        );
    }

    /// Found by the argv target's design review: `-c /dev/zero` read forever before the cap.
    #[test]
    fn an_endless_train_config_file_is_refused() {
        let e = run(&["train", "-c", "/dev/zero"]).expect_err("/dev/zero passed");
        assert!(e.contains("/dev/zero") && e.contains("larger than"), "{e}");
    }

    /// Flags of mlx-lm's tools that change nothing here are accepted, so that their command
    /// lines run: `--trust-remote-code` (no code is ever run from a model directory) wherever
    /// mlx-lm takes it, `generate --use-default-chat-template` (which `mlx_lm.generate`
    /// parses and ignores) and `serve --use-default-chat-template` (a no-op in
    /// mlx_lm.server for a model with a chat template; without one it fails there).
    #[test]
    fn mlx_lm_s_no_op_flags_are_accepted() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/models/dense_f32");
        let out = std::env::temp_dir().join(format!("mlx-check-noop-{}", std::process::id()));
        let out = out.to_str().unwrap();
        for (args, sub) in [
            (
                &[
                    "generate",
                    "--trust-remote-code",
                    "--use-default-chat-template",
                ][..],
                "generate",
            ),
            (&["chat", "--trust-remote-code"], "chat"),
            (
                &["cache-prompt", "--trust-remote-code", "-p", "x"],
                "cache-prompt",
            ),
            (&["serve", "--trust-remote-code"], "serve"),
            (&["serve", "--use-default-chat-template"], "serve"),
            (&["benchmark", "--trust-remote-code"], "benchmark"),
            (
                &[
                    "convert",
                    "--hf-path",
                    dir,
                    "--mlx-path",
                    out,
                    "--trust-remote-code",
                ],
                "convert",
            ),
            (
                &[
                    "fuse",
                    "--model",
                    dir,
                    "--adapter-path",
                    dir,
                    "--trust-remote-code",
                ],
                "fuse",
            ),
        ] {
            let mut args = args.to_vec();
            let cache = format!("{out}.safetensors");
            if sub == "cache-prompt" {
                args.extend(["--prompt-cache-file", &cache]);
            }
            assert_eq!(run(&args), Ok(sub), "{args:?}");
        }
    }

    /// Long flags may be abbreviated to a unique prefix, as argparse (mlx-lm's parser,
    /// `allow_abbrev`) reads them; an ambiguous prefix is refused.
    #[test]
    fn unique_prefixes_of_long_flags_are_read_as_argparse_reads_them() {
        let argv = [
            "mlx",
            "generate",
            "--max-tok",
            "5",
            "--ignore-chat",
            "--prefill-resp",
            "x",
        ];
        match parse(argv.map(OsString::from)) {
            Ok(Checked::Generate(a, _)) => {
                assert_eq!(a.max_tokens, 5);
                assert!(a.ignore_chat_template);
                assert_eq!(a.prefill_response.as_deref(), Some("x"));
            }
            Ok(_) => unreachable!(),
            Err(e) => panic!("{}", e.message()),
        }
        // Exact names still win over longer ones they begin (`--prompt`, `--prompt-ids`).
        assert_eq!(run(&["generate", "--prompt", "hi"]), Ok("generate"));
        let e = parse(["mlx", "generate", "--top", "5"].map(OsString::from)).err();
        assert_eq!(e.map(|e| e.code()), Some(2));
    }

    /// mlx_lm.server's `--log-level` names (`WARNING`, `CRITICAL`, any case) are levels here
    /// too; an unknown word is refused (the log filter read it as a target name and logged
    /// nothing, errors included).
    #[test]
    fn serve_log_levels_are_mlx_lm_s_names_or_refused() {
        let level = |l: &str| {
            let argv = ["mlx", "serve", "--log-level", l].map(OsString::from);
            match parse(argv) {
                Ok(Checked::Serve(a)) => Ok(a.log_level),
                Ok(_) => unreachable!(),
                Err(e) => Err((e.code(), e.message())),
            }
        };
        for (given, read) in [
            ("DEBUG", "debug"),
            ("INFO", "info"),
            ("WARNING", "warn"),
            ("ERROR", "error"),
            ("CRITICAL", "error"),
            ("warn", "warn"),
            ("trace", "trace"),
            ("off", "off"),
        ] {
            assert_eq!(level(given), Ok(read.to_string()), "{given}");
        }
        let e = level("bogus").expect_err("bogus passed");
        assert!(
            e.0 == 2 && e.1.contains("--log-level") && e.1.contains("WARNING"),
            "{e:?}"
        );
    }

    /// `--prompt-cache-bytes` takes mlx_lm.server's units (`_parse_size`: M/MB = 10^6,
    /// G/GB = 10^9, a decimal number, rounded down exactly).
    #[test]
    fn serve_prompt_cache_bytes_takes_mlx_lm_s_units() {
        let bytes = |v: &str| {
            let argv = ["mlx", "serve", "--prompt-cache-bytes", v].map(OsString::from);
            match parse(argv) {
                Ok(Checked::Serve(a)) => Ok(a.prompt_cache_bytes),
                Ok(_) => unreachable!(),
                Err(e) => Err(e.message()),
            }
        };
        for (given, read) in [
            ("1073741824", 1_073_741_824),
            ("1GB", 1_000_000_000),
            ("2g", 2_000_000_000),
            ("512M", 512_000_000),
            ("512 mb", 512_000_000),
            ("1.5G", 1_500_000_000),
            ("4.35M", 4_350_000),
            ("0.0000005M", 0),
            (".5G", 500_000_000),
        ] {
            assert_eq!(bytes(given), Ok(read), "{given}");
        }
        for bad in ["1TB", "GB", "", "1.2.3M", "-1", "99999999999999999999G"] {
            let e = bytes(bad).expect_err(bad);
            assert!(e.contains("--prompt-cache-bytes"), "{bad}: {e}");
        }
    }

    #[test]
    fn help_is_not_an_error_exit() {
        let e = parse(["mlx", "--help"].map(OsString::from)).err();
        assert_eq!(e.map(|e| e.code()), Some(0));
    }
}
