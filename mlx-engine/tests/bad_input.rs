//! Bad input to the engine is an error naming the problem, checked before the first forward:
//! token ids outside the vocabulary, non-finite sampler settings, NaN logits, EOS ids the model
//! cannot produce, and chat templates that would run forever or exhaust memory.

use std::collections::BTreeMap;
use std::path::PathBuf;

use mlx_core::io::{load_safetensors, save_safetensors};
use mlx_core::prelude::*;
use mlx_engine::generate::{generate_step, GenerateOptions};
use mlx_engine::sample::{make_logits_processors, ProcessorSettings, Sampler, SamplerSettings};
use mlx_engine::stream::{stream_generate, StreamOptions};
use mlx_engine::{ChatTemplate, ChatTemplateOptions, Tokenizer};
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::LanguageModel;

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../mlx-models/tests/models/dense_f32")
}

fn model() -> Box<dyn LanguageModel> {
    load_model_dir(&model_dir(), &LoadOptions::default())
        .unwrap()
        .0
}

fn gen_err(model: &dyn LanguageModel, prompt: &[i32], opts: GenerateOptions) -> String {
    match generate_step(prompt, model, None, opts) {
        Ok(steps) => {
            for s in steps {
                if let Err(e) = s {
                    return e.to_string();
                }
            }
            panic!("generation from {prompt:?} succeeded")
        }
        Err(e) => e.to_string(),
    }
}

fn opts(max: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens: Some(max),
        ..Default::default()
    }
}

#[test]
fn token_ids_outside_the_vocabulary_are_refused_before_the_forward() {
    let m = model();
    assert_eq!(m.vocab_size(), 128);
    // 999999 crashed inside MLX's gather; 200 read past the embedding and "worked".
    for bad in [999_999, 200, 128, -1] {
        let e = gen_err(m.as_ref(), &[1, bad], opts(2));
        assert!(
            e.contains(&format!("token id {bad}")) && e.contains("vocabulary of 128"),
            "{bad}: {e}"
        );
    }
    // The last valid id works.
    assert_eq!(
        generate_step(&[1, 127], m.as_ref(), None, opts(2))
            .unwrap()
            .count(),
        2
    );
    // Logit-bias ids are token ids too.
    let procs = make_logits_processors(&ProcessorSettings {
        logit_bias: vec![(5000, 1.0)],
        ..Default::default()
    })
    .unwrap();
    let e = gen_err(
        m.as_ref(),
        &[1, 2],
        GenerateOptions {
            logits_processors: procs,
            ..opts(2)
        },
    );
    assert!(e.contains("logit_bias") && e.contains("5000"), "{e}");
}

#[test]
fn an_empty_prompt_gets_a_plain_message() {
    let m = model();
    let e = gen_err(m.as_ref(), &[], opts(1));
    assert!(e.contains("prompt is empty"), "{e}");
}

#[test]
fn non_finite_or_out_of_range_sampler_settings_are_refused() {
    let m = model();
    for (settings, needle) in [
        (
            SamplerSettings {
                temp: f64::NAN,
                ..Default::default()
            },
            "temp",
        ),
        (
            SamplerSettings {
                temp: f64::INFINITY,
                ..Default::default()
            },
            "temp",
        ),
        (
            SamplerSettings {
                temp: -1.0,
                ..Default::default()
            },
            "temp",
        ),
        (
            SamplerSettings {
                temp: 1.0,
                top_p: f64::NAN,
                ..Default::default()
            },
            "top_p",
        ),
        (
            SamplerSettings {
                temp: 1.0,
                xtc_special_tokens: vec![4096],
                ..Default::default()
            },
            "4096",
        ),
    ] {
        let e = gen_err(
            m.as_ref(),
            &[1, 2],
            GenerateOptions {
                sampler: Sampler::new(settings.clone()),
                ..opts(2)
            },
        );
        assert!(e.contains(needle), "{settings:?}: {e}");
    }
    let e = gen_err(
        m.as_ref(),
        &[1, 2],
        GenerateOptions {
            kv_bits: Some(0),
            ..opts(2)
        },
    );
    assert!(e.contains("bits 0"), "{e}");
}

#[test]
fn nan_logits_are_an_error_not_token_zero() {
    let dir = std::env::temp_dir().join(format!("mlx-engine-nan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(model_dir().join("config.json"), dir.join("config.json")).unwrap();
    let (mut w, _) = load_safetensors(model_dir().join("model.safetensors"), None).unwrap();
    let n = w["model.norm.weight"].size();
    w.insert(
        "model.norm.weight".into(),
        Array::from_slice(&vec![f32::NAN; n], &[n as i32]).unwrap(),
    );
    save_safetensors(
        dir.join("model.safetensors"),
        w.iter().map(|(k, v)| (k.as_str(), v)),
        &BTreeMap::new(),
    )
    .unwrap();
    let (m, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
    for temp in [0.0, 1.0] {
        let e = gen_err(
            m.as_ref(),
            &[1, 2, 3],
            GenerateOptions {
                sampler: Sampler::new(SamplerSettings {
                    temp,
                    ..Default::default()
                }),
                ..opts(3)
            },
        );
        assert!(e.contains("not finite"), "temp {temp}: {e}");
    }
}

/// A word-level tokenizer of `n` tokens `t0`..`t{n-1}`.
fn tokenizer(n: u32, extra_eos: &[u32]) -> Tokenizer {
    let vocab = (0..n).map(|i| (format!("t{i}"), i)).collect();
    let wl = tokenizers::models::wordlevel::WordLevel::builder()
        .vocab(vocab)
        .unk_token("t0".into())
        .build()
        .unwrap();
    Tokenizer::from_parts(
        tokenizers::Tokenizer::new(wl),
        &serde_json::Map::new(),
        extra_eos,
    )
    .unwrap()
}

#[test]
fn eos_ids_the_model_cannot_produce_are_a_warning_not_an_error() {
    // mlx-lm generates with such a model (a config naming Llama 3's 128001 beside a
    // 49152-token vocabulary): generation runs to the token limit, and the loader warns.
    let m = model();
    let so = StreamOptions {
        generate: opts(2),
        ..Default::default()
    };
    let tok = tokenizer(128, &[300]);
    let w = mlx_engine::stream::eos_outside_vocab(m.as_ref(), &tok).expect("a warning");
    assert!(w.contains("EOS token id 300"), "{w}");
    assert!(w.contains("vocabulary of"), "{w}");
    let stream = stream_generate(m.as_ref(), &tok, &[1, 2], None, so.clone())
        .expect("an EOS id outside the vocabulary is accepted");
    let mut n = 0;
    for r in stream {
        r.unwrap();
        n += 1;
    }
    assert_eq!(n, 2, "ran to max_tokens");
    let tok = tokenizer(128, &[2]);
    assert!(mlx_engine::stream::eos_outside_vocab(m.as_ref(), &tok).is_none());
    assert!(stream_generate(m.as_ref(), &tok, &[1, 2], None, so).is_ok());
}

fn render(source: &str) -> Result<String, String> {
    let t = ChatTemplate::new(source).map_err(|e| e.to_string())?;
    let msgs = vec![serde_json::json!({"role": "user", "content": "hi"})];
    t.render(&msgs, &ChatTemplateOptions::generation(true), &[])
        .map_err(|e| e.to_string())
}

#[test]
fn templates_cannot_abort_run_forever_or_exhaust_memory() {
    // Aborted the process (a 1 TB indent).
    let e = render("{{ messages | tojson(indent=1000000000000) }}").unwrap_err();
    assert!(e.contains("indent"), "{e}");
    assert!(render("{{ messages | tojson(indent=2) }}").is_ok());
    // Ran for hours.
    let e =
        render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
            .unwrap_err();
    assert!(
        e.contains("chat template") && e.contains("loops too long"),
        "{e}"
    );
    // Doubling a string 64 times.
    let e = render(
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
    )
    .unwrap_err();
    assert!(e.contains("too much text"), "{e}");
}

/// Found by `cargo xtask fuzz template`: `{%}` made the `{% generation %}` rewrite slice
/// backwards (a panic).
#[test]
fn fuzz_regression_overlapping_tag_delimiters() {
    for src in ["{%}{%", "{%}%- endfor %}", "{%}", "x{%"] {
        assert!(render(src).is_err(), "{src}");
    }
}

/// Found by `cargo xtask fuzz tokenizer`: a deeply nested `decoder` made the tokenizers crate
/// panic (`expect("Helper")`) instead of failing.
#[test]
fn fuzz_regression_deeply_nested_tokenizer_json() {
    let dir = std::env::temp_dir().join(format!("mlx-engine-deep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let nested = format!("{}1{}", "[".repeat(173), "]".repeat(173));
    let json = format!(
        r#"{{"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":{{"type":{nested}}},"model":{{"type":"WordLevel","vocab":{{"a":0}},"unk_token":"a"}}}}"#
    );
    std::fs::write(dir.join("tokenizer.json"), json).unwrap();
    let e = Tokenizer::from_dir(&dir).unwrap_err().to_string();
    assert!(e.contains("tokenizer.json") && e.contains("nests"), "{e}");
}

/// Found by `cargo xtask fuzz template` (a 5 s hang): printing `messages * 1000000` built a
/// Python repr of three million dicts outside the fuel budget. The list is now refused before
/// it is built; a list the fuel allows still may not print longer than `MAX_PRINTED_VALUE`.
#[test]
fn fuzz_regression_printing_a_huge_list() {
    let e = render("{{ messages * 1000000 }}").unwrap_err();
    assert!(e.contains("stopped after"), "{e}");
    assert!(render("{{ messages * 3 }}").is_ok());
    let big = ChatTemplate::new("{{ messages * 200000 }}")
        .unwrap()
        .with_fuel(100_000_000);
    let msgs = vec![serde_json::json!({"role": "user", "content": "hi"})];
    let e = big
        .render(&msgs, &ChatTemplateOptions::default(), &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("a printed value is longer than"), "{e}");
}

/// A runaway template stops within the default budget, with an error that names the template
/// and its budget: `TEMPLATE_FUEL` plus `TEMPLATE_FUEL_PER_ITEM` per message and
/// `TEMPLATE_FUEL_PER_BYTE` per byte of input.
#[test]
fn a_runaway_template_stops_within_the_default_fuel() {
    use mlx_engine::chat_template::{
        TEMPLATE_FUEL, TEMPLATE_FUEL_PER_BYTE, TEMPLATE_FUEL_PER_ITEM,
    };
    let forever =
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}";
    let msgs = vec![serde_json::json!({"role": "user", "content": "hi"})];
    let opts = ChatTemplateOptions::generation(true);
    let t = ChatTemplate::named("tool_use", forever).unwrap();
    // "role" "user" "content" "hi": 17 bytes.
    let budget = TEMPLATE_FUEL + TEMPLATE_FUEL_PER_ITEM + 17 * TEMPLATE_FUEL_PER_BYTE;
    assert_eq!(t.fuel_for(&msgs, &opts), budget);
    let e = t.render(&msgs, &opts, &[]).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "rendering \"tool_use\" stopped after {budget} units of work"
        )) && e.contains("loops too long"),
        "{e}"
    );
    // A fixed budget replaces the sized one.
    let e = t
        .with_fuel(1000)
        .render(&msgs, &opts, &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("stopped after 1000 units of work"), "{e}");
    // Through the tokenizer, the name of the config's template it picked.
    let mut tok = tokenizer(128, &[2]);
    tok.set_chat_template(Some(mlx_engine::ChatTemplates::Named(vec![
        ("default".into(), "{{ messages[0].content }}".into()),
        ("tool_use".into(), forever.into()),
    ])));
    assert_eq!(tok.apply_chat_template(&msgs, &opts).unwrap(), "hi");
    let mut with_tools = opts.clone();
    with_tools.tools = Some(vec![serde_json::json!({"type": "function"})]);
    let e = tok
        .apply_chat_template(&msgs, &with_tools)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rendering \"tool_use\" stopped after"), "{e}");
    let e = render(forever).unwrap_err();
    assert!(e.contains("rendering \"chat_template\" stopped"), "{e}");
}

/// The rendered text may not pass `MAX_RENDERED_TEXT` (32 MiB), even where a long input pays
/// for the work.
#[test]
fn rendered_text_is_bounded() {
    let msgs = vec![serde_json::json!({"role": "user", "content": "x".repeat(1 << 20)})];
    let t =
        ChatTemplate::new("{% for i in range(40) %}{{ messages[0].content }}{% endfor %}").unwrap();
    let e = t
        .render(&msgs, &ChatTemplateOptions::default(), &[])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rendering \"chat_template\" stopped: the rendered text passed 33554432 bytes"),
        "{e}"
    );
    let t =
        ChatTemplate::new("{% for i in range(30) %}{{ messages[0].content }}{% endfor %}").unwrap();
    let text = t
        .render(&msgs, &ChatTemplateOptions::default(), &[])
        .unwrap();
    assert_eq!(text.len(), 30 << 20);
}

/// Serializing is paid from the fuel (a byte costs a quarter of a fuel, the price minijinja puts
/// on its own serialization) and `split` pays one fuel per piece before building the pieces:
/// both used to do far more work per unit of fuel than anything else.
#[test]
fn serializing_and_splitting_are_paid_for() {
    let msgs = vec![serde_json::json!({"role": "user", "content": "x".repeat(40_000)})];
    let opts = ChatTemplateOptions::default();
    let t = ChatTemplate::new("{{ messages | tojson }}").unwrap();
    let (text, used) = t.render_counted(&msgs, &opts, &[]).unwrap();
    assert!(
        used as usize >= text.len() / 4,
        "{used} fuel for {} bytes",
        text.len()
    );
    let t = ChatTemplate::new("{% for m in messages %}{{ m }}{% endfor %}").unwrap();
    let (text, used) = t.render_counted(&msgs, &opts, &[]).unwrap();
    assert!(
        used as usize >= text.len() / 4,
        "{used} fuel for {} bytes",
        text.len()
    );
    let e = render("{% for i in range(100000) %}{% for j in range(100000) %}{% set x = messages | tojson %}{% endfor %}{% endfor %}")
        .unwrap_err();
    assert!(e.contains("stopped after"), "{e}");
    // 50,000 pieces: 50,000 fuel up front (the list alone would cost 25,000 after the fact).
    let split = "{{ ('a ' * 50000).split() | length }}";
    let e = ChatTemplate::new(split)
        .unwrap()
        .with_fuel(40_000)
        .render(&[], &opts, &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("stopped after 40000 units"), "{e}");
    let n = ChatTemplate::new(split)
        .unwrap()
        .with_fuel(200_000)
        .render(&[], &opts, &[])
        .unwrap();
    assert_eq!(n, "50000");
}

/// Found by `cargo xtask fuzz template` (a stack overflow): a namespace holding itself made
/// printing and `tojson` recurse forever.
#[test]
fn fuzz_regression_a_value_that_contains_itself() {
    let e = render("{% set ns = namespace(n=0) %}{% set ns.n = ns %}{{ ns.n }}").unwrap_err();
    assert!(e.contains("nested more than"), "{e}");
    let e =
        render("{% set ns = namespace(n=0) %}{% set ns.n = ns %}{{ ns | tojson }}").unwrap_err();
    assert!(e.contains("nested more than"), "{e}");
}

/// Found by `cargo xtask fuzz tokenizer` (2 inputs in 330k): with this malformed normalizer
/// the tokenizers crate indexes past a buffer while encoding (a panic inside the crate).
#[test]
fn fuzz_regression_tokenizers_crate_panic_is_an_error() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz_regressions/tokenizer_normalizer");
    let r = Tokenizer::from_dir(&dir).and_then(|t| {
        let ids = t.encode("hello world <s> héllo\u{0} </s> 123", true)?;
        t.decode(&ids, false).map(|_| ())
    });
    let e = r.expect_err("the tokenizer should fail").to_string();
    assert!(e.contains("panicked"), "{e}");
}

/// Found by `cargo xtask fuzz template` (a 5 s watchdog hit under load): a 100 MB string
/// printed once per message used 300 MB before the fuel ran out; the budget now stops it at
/// the first.
#[test]
fn fuzz_regression_huge_strings_run_out_of_fuel() {
    let e = render("{% for m in messages %}{{ 'x' * 100000000 }}{% endfor %}").unwrap_err();
    assert!(e.contains("too much text"), "{e}");
}

/// `str.format` padded or printed to the width or precision its spec asks for before any
/// fuel was paid: `'{:>999999999999}'.format('a')` aborted the process (a 1 TB allocation).
/// The spec's widths and precisions are now paid for first.
#[test]
fn str_format_widths_are_paid_for_before_they_are_built() {
    for src in [
        "{{ '{:>999999999999}'.format('a') }}",
        "{{ '{0:<300000000}{0}'.format('a') | length }}",
        "{{ '{:.300000000f}'.format(1.5) | length }}",
    ] {
        let e = render(src).unwrap_err();
        assert!(e.contains("too much text"), "{src}: {e}");
    }
    assert_eq!(
        render("{{ '{:>6}|{:.2f}|{{}}'.format('a', 1.5) }}").unwrap(),
        "     a|1.50|{}"
    );
}

/// Sampler and input errors are typed (issue #29): the variant says what kind of failure it
/// is and its fields name the parameter or input.
#[test]
fn sampler_and_input_errors_are_typed() {
    use mlx_engine::sample::{apply_top_k, check_token_ids};
    use mlx_engine::EngineError;
    let hot = SamplerSettings {
        temp: -1.0,
        ..Default::default()
    };
    match hot.validate(16).unwrap_err() {
        EngineError::Sampler { parameter, problem } => {
            assert_eq!(parameter, "temp");
            assert!(problem.contains("finite number >= 0"), "{problem}");
        }
        e => panic!("expected EngineError::Sampler, got {e:?}"),
    }
    let lp = Array::from_slice(&[0.0f32; 4], &[1, 4]).unwrap();
    let e = apply_top_k(&lp, 9).unwrap_err();
    assert!(
        matches!(&e, EngineError::Sampler { parameter, .. } if parameter == "top_k"),
        "{e:?}"
    );
    assert!(
        e.to_string().starts_with("sampler: top_k: has to be"),
        "{e}"
    );
    match check_token_ids("logit_bias", &[3, 20], 16).unwrap_err() {
        EngineError::Input { what, problem } => {
            assert_eq!(what, "logit_bias");
            assert!(problem.contains("token id 20 (position 1)"), "{problem}");
        }
        e => panic!("expected EngineError::Input, got {e:?}"),
    }
}
