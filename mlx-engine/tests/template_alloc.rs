//! A chat template cannot make one render build far more than its fuel pays for: this
//! binary's peak resident memory (Linux `VmHWM`; only these tests run in it, each of them
//! bounded, so no unbounded allocation of another test mixes in) stays small while runaway
//! templates are stopped.

use mlx_engine::tokenizer_gguf::GgufTokenizerData;
use mlx_engine::{ChatTemplate, ChatTemplateOptions, Tokenizer};

/// The process's peak resident set, in bytes (`None` where `/proc` does not say).
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn assert_small_peak() {
    if let Some(peak) = peak_rss() {
        assert!(peak < 200 << 20, "peak resident memory {peak} bytes");
    }
}

fn render(source: &str) -> Result<String, String> {
    let t = ChatTemplate::new(source).map_err(|e| e.to_string())?;
    let msgs = vec![serde_json::json!({"role": "user", "content": "hi"})];
    t.render(&msgs, &ChatTemplateOptions::generation(true), &[])
        .map_err(|e| e.to_string())
}

/// `('{0}' * 100).format('x' * 3000000)` built its 300 MB result before the fuel was charged
/// (and `('{0}' * 100000).format(...)` would have asked for terabytes): each field now pays
/// for the largest argument it may print before the text is built.
#[test]
fn str_format_pays_for_repeated_arguments_before_building() {
    let t = ChatTemplate::new("{{ (('{0}' * 100).format('x' * 3000000)) | length }}").unwrap();
    let msgs = vec![serde_json::json!({"role": "user", "content": "hi"})];
    let e = t
        .render(&msgs, &ChatTemplateOptions::generation(true), &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("too much text"), "{e}");
    assert_small_peak();
}

/// Doubling a list 40 times (`ns.x + ns.x`) made minijinja copy 2^33 items at once (the
/// process aborted: `memory allocation of 6442450944 bytes failed`), and a list holding
/// itself twice (`[ns.x, ns.x]`, a few bytes that print as terabytes) ran without end in
/// everything that prints or compares it. Each form now stops with the budget's error.
const DOUBLING: &[&str] = &[
    // List concatenation.
    "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = ns.x + ns.x %}{% endfor %}{{ ns.x|length }}",
    "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = ns.x + ns.x %}{% endfor %}{{ ns.x|batch(3)|list|length }}",
    "{% set ns = namespace(x=[[1]]) %}{% for i in range(40) %}{% set ns.x = [ns.x|sum(start=[])] + ns.x %}{% endfor %}{{ ns.x|length }}",
    "{% set x = [[1] * 1000] * 100000 %}{{ x|sum(start=[])|length }}",
    // Strings.
    "{% set ns = namespace(x='x') %}{% for i in range(64) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x|length }}",
    "{% set ns = namespace(x='x') %}{% for i in range(64) %}{% set ns.x = ns.x + ns.x %}{% endfor %}{{ ns.x|length }}",
    "{% set ns = namespace(x='x') %}{% for i in range(64) %}{% set ns.x = ns.x * 2 %}{% endfor %}{{ ns.x|length }}",
    "{% set ns = namespace(x='x') %}{% for i in range(64) %}{% set ns.x = [ns.x, ns.x]|join %}{% endfor %}{{ ns.x|length }}",
    "{% set ns = namespace(x='x') %}{% for i in range(64) %}{% set ns.x = '{0}{0}'.format(ns.x) %}{% endfor %}{{ ns.x|length }}",
    "{% set ns = namespace(x='x') %}{% for i in range(64) %}{% set ns.x = ns.x|replace('x', 'xx') %}{% endfor %}{{ ns.x|length }}",
    "{{ ('a\\n' * 100000)|indent(100000)|length }}",
    "{{ (['a'] * 100000)|join('y' * 100000)|length }}",
    // Lists repeated.
    "{% set ns = namespace(x=['a']) %}{% for i in range(40) %}{% set ns.x = ns.x * 2 %}{% endfor %}{{ ns.x|length }}",
    // A list holding itself twice, then printed, joined, compared, serialized.
    "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ (ns.x ~ '')|length }}",
    "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x|join|length }}",
    "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x|upper|length }}",
    "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x|pprint|length }}",
    "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ '%s'|format(ns.x)|length }}",
    "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ '{}'.format(ns.x)|length }}",
    "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x in 'abc' }}",
    "{% set ns = namespace(x=[1], y=[2]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% set ns.y = [ns.y, ns.y] %}{% endfor %}{{ ns.x == ns.y }}",
    "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x|string|length }}",
    "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x|tojson|length }}",
    "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x }}",
    "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x|sort|length }}",
    "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ raise_exception(ns.x) }}",
    "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x|map('string')|list|length }}",
    "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ['a', 'b']|join(ns.x)|length }}",
    "{% set ns = namespace(x=[1], y=[2]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% set ns.y = [ns.y, ns.y] %}{% endfor %}{{ ns.x is eq(ns.y) }}",
    // Maps.
    "{% set ns = namespace(x={}) %}{% for i in range(40) %}{% set ns.x = {'a': ns.x, 'b': ns.x} %}{% endfor %}{{ (ns.x ~ '')|length }}",
    "{% set ns = namespace(x={}) %}{% for i in range(40) %}{% set ns.x = dict(a=ns.x, b=ns.x) %}{% endfor %}{{ ns.x|dictsort|length }}",
    // A namespace holding itself, compared.
    "{% set ns = namespace(n=0) %}{% set ns.n = ns %}{{ ns == 1 }}",
];

fn is_budget_error(e: &str) -> bool {
    [
        "stopped after",
        "too much text",
        "too large",
        "longer than",
        "nested more than",
        "levels",
    ]
    .iter()
    .any(|n| e.contains(n))
}

#[test]
fn doubling_templates_stop_within_the_budget() {
    for src in DOUBLING {
        assert!(ChatTemplate::new(src).unwrap().bounded(), "{src}");
        let e = render(src).expect_err(src);
        assert!(is_budget_error(&e), "{src}: {e}");
    }
    // What the fuel allows still renders, and as before.
    assert_eq!(
        render("{% set ns = namespace(x=[1]) %}{% for i in range(10) %}{% set ns.x = ns.x + ns.x %}{% endfor %}{{ ns.x|length }}")
            .unwrap(),
        "1024"
    );
    assert_eq!(
        render("{% set ns = namespace(x=[1]) %}{% for i in range(3) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x }}|{{ ns.x|length }}|{{ [1] in [[1]] }}|{{ 'a' ~ [1, 'b'] }}|{{ [[1, 2]]|sum(start=[0]) }}")
            .unwrap(),
        "[[[[1], [1]], [[1], [1]]], [[[1], [1]], [[1], [1]]]]|2|True|a[1, 'b']|[0, 1, 2]"
    );
    assert_small_peak();
}

/// The doubling template from a model directory's `tokenizer_config.json` and from GGUF
/// metadata: the error names where the template came from.
#[test]
fn doubling_templates_from_model_files_name_their_source() {
    let bomb = DOUBLING[0];
    let msgs = vec![serde_json::json!({"role": "user", "content": "hi"})];
    let opts = ChatTemplateOptions::generation(true);

    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_chat");
    let dir = std::env::temp_dir().join(format!("mlx-template-bomb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixture.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture.join("tokenizer_config.json")).unwrap())
            .unwrap();
    config["chat_template"] = serde_json::Value::from(bomb);
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::to_vec(&config).unwrap(),
    )
    .unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let e = tok
        .apply_chat_template(&msgs, &opts)
        .unwrap_err()
        .to_string();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        e.contains("tokenizer_config.json") && e.contains("stopped after"),
        "{e}"
    );

    let mut tokens: Vec<String> = (0..=255u8)
        .map(mlx_engine::tokenizer_stream::byte_to_unicode)
        .map(String::from)
        .collect();
    tokens.push("<|end|>".into());
    let data = GgufTokenizerData {
        model: "gpt2".into(),
        pre: Some("gpt2".into()),
        tokens,
        eos_id: Some(256),
        chat_template: Some(bomb.into()),
        ..Default::default()
    };
    let tok = data.build().unwrap();
    let e = tok
        .apply_chat_template(&msgs, &opts)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("GGUF metadata `tokenizer.chat_template`") && e.contains("stopped after"),
        "{e}"
    );
    assert_small_peak();
}
