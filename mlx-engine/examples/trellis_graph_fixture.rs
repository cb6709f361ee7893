//! Writes the graph decoder's trellis step check's inputs (`xtask/gpu/trellis_step_emulate.py`):
//! a trellis-coded model, what `mlx_engine::graph::map_model` hands the decoder, and the
//! model's own MLX forward (the reference: mlx-lm has no trellis mode) teacher-forced.
//!
//!     cargo run -p mlx-engine --example trellis_graph_fixture -- OUT [MODEL_DIR | BLOCK [CODE [VCODE]]]
//!
//! Without MODEL_DIR, `dense_bf16_untied` (mlx-models' fixture) is converted to trellis 3-bit
//! (L 8, seed 0: the `graph_spec` test's conversion) into OUT/model, in blocks of BLOCK weights
//! (default 64, the converter's: the kernels' general path; 32 takes their unrolled path, as
//! the quantizer's 3-bit choice and the bench twins do), with the code CODE (`1mad`, the
//! default; `1mad8`: the kernels' table path; `1mad8h`: at L 12, the default state of a
//! `1mad8h` conversion, the same table at hashed indices; `1mad8s`, `gauss8s`, `gauss7s`: at L
//! 12, the S-box and the code's table); with VCODE the value projections take that code at
//! CODE's L (`mlx convert --q-trellis-v-code`: `64 gauss7s 1mad` is the hybrid). Then, into
//! OUT:
//! - `graph.safetensors`: every array of the decoder's `GraphWeights` (`embed.*`, `head.*`,
//!   `final_norm`, `layers.I.{input_norm,post_norm}`, `layers.I.P.{weight,scales,su,sv,bias}`
//!   for P in q k v o gate up down; the scales as float32, as the decoder uploads them), the
//!   RoPE's inverse frequencies, the prompt's KV cache from the MLX prefill (`kv.I.keys`,
//!   `kv.I.values`, `[kv_heads, prompt, head_dim]`), and the teacher-forced steps: `tokens`
//!   (int32, the token fed at each step: the prefill's greedy pick, then the reference's) and
//!   `logits` (float32 `[steps, vocab]`, the MLX forward's at each step);
//! - the metadata `spec`: the `GraphSpec`'s numbers as JSON (`trellis_v_code` and
//!   `trellis_v_l`: the value projections' own code and L, where they have one).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_core::{ops, Array, Dtype};
use mlx_kernels::graph_decode::GraphLinear;
use mlx_models::load::{load_model_dir, LoadOptions};

const PROMPT: usize = 150;
const STEPS: usize = 8;

fn main() {
    if let Err(e) = run() {
        eprintln!("trellis_graph_fixture: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = PathBuf::from(
        args.first()
            .ok_or("usage: trellis_graph_fixture OUT [MODEL_DIR]")?,
    );
    std::fs::create_dir_all(&out)?;
    let dir = match args.get(1) {
        Some(d) if d.parse::<i32>().is_err() => PathBuf::from(d),
        b => {
            let code = |c: &str| {
                mlx_core::cpu::trellis::TrellisCode::from_name(c).ok_or_else(|| {
                    format!("CODE {c:?}: 1mad, 1mad8, 1mad8h, 1mad8s, gauss8s or gauss7s")
                })
            };
            let main = match args.get(2) {
                None => mlx_core::cpu::trellis::TrellisCode::Mad,
                Some(c) => code(c)?,
            };
            let v = args.get(3).map(|c| code(c)).transpose()?;
            convert_fixture(&out, b.and_then(|b| b.parse().ok()), main, v)?
        }
    };
    let model = load_model_dir(&dir, &LoadOptions::default())?.0;
    let (spec, weights) =
        mlx_engine::graph::map_model(model.as_ref()).map_err(|e| format!("map_model: {e}"))?;
    spec.check()?;
    weights.check(&spec)?;
    let t = spec.trellis.ok_or("not a trellis-coded model")?;
    let mut arrays: Vec<(String, Array)> = Vec::new();
    let push_lin = |arrays: &mut Vec<(String, Array)>, name: &str, l: &GraphLinear| {
        arrays.push((format!("{name}.weight"), l.weight.clone()));
        if let Some(s) = &l.scales {
            let s = if l.trellis.is_some() {
                s.astype(Dtype::Float32).expect("scales as float32")
            } else {
                s.clone()
            };
            arrays.push((format!("{name}.scales"), s));
        }
        if let Some(b) = &l.biases {
            arrays.push((format!("{name}.biases"), b.clone()));
        }
        if let Some(b) = &l.bias {
            arrays.push((format!("{name}.bias"), b.clone()));
        }
        if let Some(g) = &l.trellis {
            arrays.push((format!("{name}.su"), g.su.clone()));
            arrays.push((format!("{name}.sv"), g.sv.clone()));
        }
    };
    push_lin(&mut arrays, "embed", &weights.embed);
    if let Some(h) = &weights.head {
        push_lin(&mut arrays, "head", h);
    }
    arrays.push(("final_norm".into(), weights.final_norm.clone()));
    for (i, l) in weights.layers.iter().enumerate() {
        arrays.push((format!("layers.{i}.input_norm"), l.input_norm.clone()));
        arrays.push((format!("layers.{i}.post_norm"), l.post_norm.clone()));
        for (p, lin) in [
            ("q", &l.q),
            ("k", &l.k),
            ("v", &l.v),
            ("o", &l.o),
            ("gate", &l.gate),
            ("up", &l.up),
            ("down", &l.down),
        ] {
            push_lin(&mut arrays, &format!("layers.{i}.{p}"), lin);
        }
    }
    arrays.push((
        "inv_freq".into(),
        Array::from_slice(&spec.rope.inv_freq, &[spec.rope.inv_freq.len() as i32])?,
    ));
    // The prompt through the model's MLX forward, then STEPS teacher-forced steps.
    let vocab = model.vocab_size();
    let prompt: Vec<i32> = (0..PROMPT as i32)
        .map(|i| (i * 7919 + 13) % vocab)
        .collect();
    let mut caches = model.make_cache();
    let x = Array::from_slice(&prompt, &[1, PROMPT as i32])?;
    let logits = model.forward(&x, Some(&mut caches))?;
    let n = logits.dim(1)?;
    let last = ops::slice_axis(&logits, 1, n - 1, n, None)?;
    let mut token = ops::argmax(&last, -1, false, None)?
        .astype(Dtype::Int32)?
        .to_vec::<i32>()?[0];
    for (i, c) in caches.iter().enumerate() {
        match c.fetch()? {
            Some(mlx_cache::Kv::Dense { keys, values }) => {
                let sq = |a: Array| -> Result<Array, mlx_core::Error> {
                    let s = a.shape();
                    let a = ops::slice_axis(&a, 2, 0, PROMPT as i32, None)?;
                    a.reshape(&[s[1], PROMPT as i32, s[3]])
                };
                arrays.push((format!("kv.{i}.keys"), sq(keys)?));
                arrays.push((format!("kv.{i}.values"), sq(values)?));
            }
            _ => return Err("not a plain KV cache".into()),
        }
    }
    let (mut tokens, mut refs) = (Vec::new(), Vec::new());
    for _ in 0..STEPS {
        tokens.push(token);
        let x = Array::from_slice(&[token], &[1, 1])?;
        let lg = model
            .forward(&x, Some(&mut caches))?
            .astype(Dtype::Float32)?
            .to_vec::<f32>()?;
        token = lg
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &v)| if v > b.1 { (i, v) } else { b },
            )
            .0 as i32;
        refs.extend(lg);
    }
    arrays.push((
        "tokens".into(),
        Array::from_slice(&tokens, &[STEPS as i32])?,
    ));
    arrays.push((
        "logits".into(),
        Array::from_slice(&refs, &[STEPS as i32, vocab])?,
    ));
    let r = &spec.rope;
    let meta = format!(
        "{{\"hidden\": {}, \"layers\": {}, \"heads\": {}, \"kv_heads\": {}, \"head_dim\": {}, \
         \"intermediate\": {}, \"vocab\": {}, \"eps\": {:e}, \"attn_scale\": {:e}, \
         \"traditional\": {}, \"position_scale\": {:e}, \"output_scale\": {:e}, \"pairs\": {}, \
         \"rope_layers\": {:?}, \"tied\": {}, \"quant\": {:?}, \"trellis_k\": {}, \
         \"trellis_l\": {}, \"trellis_block\": {}, \"trellis_code\": \"{}\", \"prompt\": {}{}}}",
        spec.hidden,
        spec.layers,
        spec.heads,
        spec.kv_heads,
        spec.head_dim,
        spec.intermediate,
        spec.vocab,
        spec.eps,
        spec.attn_scale,
        r.traditional,
        r.position_scale,
        r.output_scale,
        r.pairs(),
        spec.rope_layers,
        spec.tied,
        spec.quant.map(|(g, b)| vec![g, b]).unwrap_or_default(),
        t.k,
        t.l,
        t.block,
        t.code.name(),
        PROMPT,
        spec.trellis_v.map_or(String::new(), |v| format!(
            ", \"trellis_v_code\": \"{}\", \"trellis_v_l\": {}",
            v.code.name(),
            v.l
        )),
    );
    let meta: BTreeMap<String, String> = [("spec".to_string(), meta)].into();
    let refs: Vec<(&str, &Array)> = arrays.iter().map(|(k, v)| (k.as_str(), v)).collect();
    mlx_core::io::save_safetensors(out.join("graph.safetensors"), refs, &meta)?;
    eprintln!(
        "wrote {} ({} arrays; trellis k {} L {} block {})",
        out.join("graph.safetensors").display(),
        arrays.len(),
        t.k,
        t.l,
        t.block
    );
    Ok(())
}

/// `dense_bf16_untied` converted to trellis 3-bit (L 8, or 12 for the hashed codes; seed 0; blocks of
/// `block`, or the converter's default; the code `code`, the value projections' `v_code` where
/// given) into `out/model`.
fn convert_fixture(
    out: &Path,
    block: Option<i32>,
    code: mlx_core::cpu::trellis::TrellisCode,
    v_code: Option<mlx_core::cpu::trellis::TrellisCode>,
) -> Result<PathBuf, Box<dyn std::error::Error>> {
    use mlx_models::config::TrellisParams;
    use mlx_models::convert::{convert, ConvertOptions};
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../mlx-models/tests/models/dense_bf16_untied");
    let dst = out.join("model");
    let _ = std::fs::remove_dir_all(&dst);
    let opts = ConvertOptions {
        quantize: true,
        q_bits: Some(3),
        q_group_size: block,
        trellis: Some(TrellisParams {
            // The hashed codes (1mad8h, 1mad8s, gauss8s, gauss7s) at their conversion's L 12.
            trellis_l: if code == mlx_core::cpu::trellis::TrellisCode::Mad
                || code == mlx_core::cpu::trellis::TrellisCode::Mad8
            {
                8
            } else {
                12
            },
            seed: 0,
            trellis_code: code,
        }),
        trellis_value_code: v_code,
        ..ConvertOptions::default()
    };
    convert(&src, &dst, &opts, &mut |_| {})?;
    Ok(dst)
}
