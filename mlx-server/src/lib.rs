//! `mlx serve`: an OpenAI-compatible HTTP server (tokio + axum) in front of
//! [`mlx_engine::batch::Engine`], which owns the model on its own thread and decodes every
//! running request in one batch (continuous batching).
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions` (streaming as server-sent
//! events ending in `data: [DONE]`, or not), `POST /v1/embeddings`, `GET /v1/models`,
//! `GET /health`, `GET /metrics` (Prometheus text), `GET /` (a chat page). Every bad request
//! gets a 4xx with an OpenAI error object; the server keeps serving.
//!
//! ```no_run
//! use clap::Parser;
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     serve: mlx_server::ServeArgs,
//! }
//! let cli = Cli::parse();
//! mlx_server::run(cli.serve, mlx_server::load_model_dir).unwrap();
//! ```
#![forbid(unsafe_code)]

mod args;
mod conn;
mod edge;
mod embeddings;
mod error;
mod guard;
mod metrics;
mod request;
mod routes;
mod state;
pub mod structured;
pub mod tools;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use mlx_engine::batch::{Engine, EngineConfig, EngineDecoder};
use mlx_engine::chat_template::ChatTemplates;
use mlx_engine::Tokenizer;
use mlx_models::LanguageModel;
use serde_json::{Map, Value};

pub use args::ServeArgs;
pub use error::ApiError;

/// What can stop the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("invalid option: {0}")]
    Args(String),
    #[error("loading the model: {0}")]
    Load(String),
    #[error("binding {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
}

/// What a loader hands the server: the model, its tokenizer and, when known, the model's own
/// context length (prompts plus `max_tokens` beyond it are refused with a 400).
pub struct LoadedModel {
    pub model: Box<dyn LanguageModel>,
    pub tokenizer: Tokenizer,
    pub context_length: Option<usize>,
}

impl From<(Box<dyn LanguageModel>, Tokenizer)> for LoadedModel {
    fn from((model, tokenizer): (Box<dyn LanguageModel>, Tokenizer)) -> Self {
        LoadedModel {
            model,
            tokenizer,
            context_length: None,
        }
    }
}

impl From<mlx_engine::load::Loaded> for LoadedModel {
    fn from(m: mlx_engine::load::Loaded) -> Self {
        LoadedModel {
            model: m.model,
            tokenizer: m.tokenizer,
            context_length: m.context_length,
        }
    }
}

pub use mlx_engine::load::context_length;

/// The context length of the model at `path`: a directory's `config.json`, or a `.gguf`
/// file's `<arch>.context_length`. `None` when it declares none or cannot be read (the
/// loader reports unreadable models).
pub fn context_length_at(path: &Path) -> Option<usize> {
    if path.is_dir() {
        let text = std::fs::read_to_string(path.join("config.json")).ok()?;
        context_length(&serde_json::from_str(&text).ok()?)
    } else {
        let g = mlx_models::gguf::read_gguf(path).ok()?;
        context_length(&g.config.raw)
    }
}

/// Why [`load_model_dir`] could not load `--model`.
#[derive(Debug, thiserror::Error)]
pub enum ModelDirError {
    #[error("--model DIR is required")]
    NoModel,
    /// Reading, checking or building the model at `path` (as given) failed.
    #[error("{path}: {source}")]
    Model {
        path: String,
        source: mlx_models::ModelError,
    },
    /// The tokenizer of the model at `path` could not be built.
    #[error("{path}: {source}")]
    Tokenizer {
        path: String,
        source: mlx_engine::TokenizerError,
    },
    /// Another failure of the one loader (its message names the file or flag).
    #[error(transparent)]
    Load(mlx_engine::load::LoadError),
}

/// Loads `--model` (a directory or a `.gguf` file) in its stored dtypes, `--adapter-path`
/// applied, through the one loader (`mlx_engine::load`): the default loader of the
/// `mlx-serve` binary.
pub fn load_model_dir(args: &ServeArgs) -> Result<LoadedModel, ModelDirError> {
    let dir = args.model.as_deref().ok_or(ModelDirError::NoModel)?;
    let spec = mlx_engine::load::LoadSpec {
        dtype: "stored".into(),
        adapter_path: args.adapter_path.as_deref().map(Into::into),
        gguf_blocks: false,
        tokenizer_config: serde_json::Map::new(),
    };
    let model = mlx_engine::load::ModelRef::Path(dir.into());
    mlx_engine::load::load(&model, &spec, &mut mlx_engine::load::Quiet)
        .map(Into::into)
        .map_err(|e| match e {
            mlx_engine::load::LoadError::Model(source) => ModelDirError::Model {
                path: dir.into(),
                source,
            },
            mlx_engine::load::LoadError::Tokenizer { source, .. } => ModelDirError::Tokenizer {
                path: dir.into(),
                source,
            },
            e => ModelDirError::Load(e),
        })
}

fn template_args(args: &ServeArgs) -> Result<Map<String, Value>, ServeError> {
    match serde_json::from_str::<Value>(&args.chat_template_args) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(ServeError::Args(format!(
            "--chat-template-args must be a JSON object, got {:?}",
            args.chat_template_args
        ))),
    }
}

/// `--decoder` and `--threads` as the engine takes them.
fn decoder(args: &ServeArgs) -> EngineDecoder {
    let threads = args.threads.map_or(0, |t| t as usize);
    match args.decoder.as_str() {
        "mlx" => EngineDecoder::Mlx,
        "cpu" => EngineDecoder::Cpu { threads },
        "graph" => EngineDecoder::Graph,
        _ => EngineDecoder::Auto { threads },
    }
}

/// `--kv-bits`, `--kv-group-size`, `--quantized-kv-start`, `--max-kv-size`: the engine's
/// one-at-a-time mode when `--kv-bits` or `--max-kv-size` is given.
fn kv_options(args: &ServeArgs) -> Result<Option<mlx_engine::batch::KvOptions>, ServeError> {
    let kv_mode = mlx_cache::KvMode::parse(&args.kv_mode)
        .map_err(|e| ServeError::Args(format!("--kv-mode: {e}")))?;
    if let Some(bits) = args.kv_bits {
        kv_mode.check(args.kv_group_size, bits).map_err(|e| {
            ServeError::Args(format!(
                "--kv-bits {bits} --kv-group-size {} --kv-mode {}: {e}",
                args.kv_group_size,
                kv_mode.name()
            ))
        })?;
    } else if kv_mode == mlx_cache::KvMode::Trellis {
        return Err(ServeError::Args(
            "--kv-mode trellis needs --kv-bits (2, 3 or 4)".into(),
        ));
    }
    if args.max_kv_size == Some(0) {
        return Err(ServeError::Args("--max-kv-size must be at least 1".into()));
    }
    if args.kv_bits.is_none() && args.max_kv_size.is_none() {
        return Ok(None);
    }
    Ok(Some(mlx_engine::batch::KvOptions {
        max_kv_size: args.max_kv_size,
        kv_bits: args.kv_bits,
        kv_group_size: args.kv_group_size,
        quantized_kv_start: mlx_engine::generate::quantized_kv_start_from(args.quantized_kv_start),
        kv_mode,
    }))
}

/// The warning for a server reachable beyond loopback without an API key.
fn exposure_warning(addr: &SocketAddr, api_key: bool) -> Option<String> {
    (!addr.ip().is_loopback() && !api_key).then(|| {
        format!(
            "listening on {addr}, beyond loopback, without --api-key: anyone who can reach \
             this address can use the model (the server has no TLS)"
        )
    })
}

/// A server that is listening: its address, and the future that serves until shutdown.
pub struct Server {
    pub addr: SocketAddr,
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: conn::Limits,
    /// The engine thread, waited for (bounded) once serving ends, so it does not free MLX
    /// arrays while the process exits.
    engine_thread: std::thread::JoinHandle<()>,
}

impl Server {
    /// Starts the engine (loading the model on its thread with `load`) and binds the
    /// listener. Must run inside a tokio runtime.
    pub async fn bind<F, L, E>(args: ServeArgs, load: F) -> Result<Server, ServeError>
    where
        F: Fn(&ServeArgs) -> Result<L, E> + Send + 'static,
        L: Into<LoadedModel>,
        E: std::fmt::Display,
    {
        if args.max_batch == 0 {
            return Err(ServeError::Args("--max-batch must be at least 1".into()));
        }
        if args.max_connections == 0 {
            return Err(ServeError::Args(
                "--max-connections must be at least 1".into(),
            ));
        }
        if args.max_tokens_limit == 0 {
            return Err(ServeError::Args(
                "--max-tokens-limit must be at least 1".into(),
            ));
        }
        if args.max_n == 0 {
            return Err(ServeError::Args("--max-n must be at least 1".into()));
        }
        let template_args = template_args(&args)?;
        let config = engine_config(&args)?;
        let load_args = args.clone();
        let (ctx_tx, ctx_rx) = std::sync::mpsc::channel();
        let (engine, engine_thread) = tokio::task::spawn_blocking(move || {
            Engine::start_with_draft(
                move || {
                    let mut m: LoadedModel = load(&load_args)
                        .map_err(|e| mlx_engine::EngineError::ModelLoad {
                            path: load_args.model.clone().unwrap_or_default(),
                            message: e.to_string(),
                        })?
                        .into();
                    if let Some(t) = load_args.chat_template.as_ref().filter(|t| !t.is_empty()) {
                        // mlx_lm.server: `tokenizer_config["chat_template"] = --chat-template`.
                        m.tokenizer
                            .set_chat_template(Some(ChatTemplates::Single(t.clone())));
                        m.tokenizer.set_chat_template_origin("--chat-template");
                    }
                    let _ = ctx_tx.send(m.context_length);
                    // `--draft-model`: loaded by the same loader, checked as mlx-lm checks it.
                    let draft = match &load_args.draft_model {
                        None => None,
                        Some(path) => {
                            let mut a = load_args.clone();
                            a.model = Some(path.clone());
                            let d: LoadedModel = load(&a)
                                .map_err(|e| mlx_engine::EngineError::DraftModel {
                                    path: path.clone(),
                                    message: e.to_string(),
                                })?
                                .into();
                            mlx_engine::speculative::check_draft_tokenizer(
                                &m.tokenizer,
                                &d.tokenizer,
                            )?;
                            Some(d.model)
                        }
                    };
                    Ok((m.model, m.tokenizer, draft))
                },
                config,
            )
        })
        .await
        .map_err(|e| ServeError::Load(e.to_string()))?
        .map_err(|e| ServeError::Load(e.to_string()))?;
        let model_context = ctx_rx.try_recv().ok().flatten();
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|source| ServeError::Bind { addr, source })?;
        let addr = listener.local_addr()?;
        if let Some(w) = exposure_warning(&addr, args.api_key.is_some()) {
            tracing::warn!("{w}");
            eprintln!("mlx serve: warning: {w}");
        }
        if let Some(n) = model_context {
            tracing::info!(context_length = n, "the model's context length");
        }
        tracing::info!(decoder = engine.decoder(), "the decoder running the batch");
        let limits = args.conn_limits();
        let guard = Arc::new(guard::Guard::new(&args));
        let state = Arc::new(state::AppState::new(
            engine,
            args,
            template_args,
            model_context,
        ));
        let router = edge::layer(guard::layer(routes::router(state.clone()), guard), state);
        Ok(Server {
            addr,
            listener,
            router,
            limits,
            engine_thread,
        })
    }

    /// Serves until `shutdown` completes, then stops accepting, closes idle and half-sent
    /// connections, gives requests in progress `--shutdown-timeout` to finish, cancels the
    /// rest and returns.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        conn::serve(self.listener, self.router, self.limits, shutdown).await;
        // The router (and with it the last engine handle) is gone, and with the connections
        // every request's events receiver: the engine drops those rows at its next step and
        // stops. Wait for it (so it does not free MLX arrays while the process exits), but
        // never hang the exit on it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !self.engine_thread.is_finished() && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        if self.engine_thread.is_finished() {
            let _ = self.engine_thread.join();
        }
        Ok(())
    }
}

/// The engine's limits from the server's flags.
pub fn engine_config(args: &ServeArgs) -> Result<EngineConfig, ServeError> {
    Ok(EngineConfig {
        max_batch: args.max_batch,
        queue_size: args.queue_size,
        prefill_step_size: args.prefill_step_size,
        max_queued_tokens: args.max_queued_tokens,
        prompt_cache_entries: args.prompt_cache_size,
        prompt_cache_bytes: args.prompt_cache_bytes,
        kv: kv_options(args)?,
        decoder: decoder(args),
        prompt_lookup: args
            .prompt_lookup_ngram
            .map(|n| mlx_engine::batch::PromptLookup {
                ngram: n as usize,
                num_draft_tokens: args.num_draft_tokens(),
            }),
        warm_up: None,
    })
}

/// A rank other than 0 of `mlx launch -- serve`: loads the model as [`run`] does and runs the
/// engine without HTTP, stepping with rank 0 (see `mlx_engine::batch::lockstep`, which must
/// be set first) until rank 0 stops or is lost.
pub fn follow<F, L, E>(args: ServeArgs, load: F) -> Result<(), ServeError>
where
    F: Fn(&ServeArgs) -> Result<L, E> + Send + 'static,
    L: Into<LoadedModel>,
    E: std::fmt::Display,
{
    let config = engine_config(&args)?;
    let (engine, handle) = Engine::start(
        move || {
            let m: LoadedModel = load(&args)
                .map_err(|e| mlx_engine::EngineError::ModelLoad {
                    path: args.model.clone().unwrap_or_default(),
                    message: e.to_string(),
                })?
                .into();
            Ok((m.model, m.tokenizer))
        },
        config,
    )
    .map_err(|e| ServeError::Load(e.to_string()))?;
    let joined = handle.join();
    drop(engine);
    joined.map_err(|_| ServeError::Load("the engine thread panicked".into()))
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    // A second server in the same process keeps the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs the server until Ctrl-C: `mlx serve`'s entry point. `load` runs on the engine thread
/// and returns the model and its tokenizer.
pub fn run<F, L, E>(args: ServeArgs, load: F) -> Result<(), ServeError>
where
    F: Fn(&ServeArgs) -> Result<L, E> + Send + 'static,
    L: Into<LoadedModel>,
    E: std::fmt::Display,
{
    init_logging(&args.log_level);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(async move {
        let server = Server::bind(args, load).await?;
        tracing::info!(addr = %server.addr, "listening");
        // Tests and scripts read this line to find an ephemeral port.
        eprintln!("mlx serve: listening on http://{}", server.addr);
        let mut signals = Signals::new()?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let name = signals.recv().await;
            eprintln!("mlx serve: {name}: shutting down (a second signal exits at once)");
            let _ = stop_tx.send(());
            let name = signals.recv().await;
            eprintln!("mlx serve: {name} again: exiting now");
            std::process::exit(130);
        });
        server
            .serve(async {
                let _ = stop_rx.await;
            })
            .await
    });
    // Work still on the blocking pool (a request being tokenized) does not hold the exit.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

/// SIGINT and SIGTERM (Ctrl-C elsewhere), each received as often as it comes.
struct Signals {
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                int: signal(SignalKind::interrupt())?,
                term: signal(SignalKind::terminate())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// The next signal's name.
    async fn recv(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.int.recv() => "SIGINT",
                _ = self.term.recv() => "SIGTERM",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn warns_beyond_loopback_without_a_key() {
        let w = |a: &str, key| super::exposure_warning(&a.parse().unwrap(), key);
        assert!(w("0.0.0.0:8080", false).is_some_and(|m| m.contains("--api-key")));
        assert!(w("[::]:8080", false).is_some());
        assert!(w("192.168.1.5:8080", false).is_some());
        assert!(w("0.0.0.0:8080", true).is_none());
        assert!(w("127.0.0.1:8080", false).is_none());
        assert!(w("[::1]:8080", false).is_none());
    }
}
