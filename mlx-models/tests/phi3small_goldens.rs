//! L1 against mlx-lm 0.32.2 for phi3small (`cargo xtask goldens phi3small`): the tiny seeded
//! models have the real 100,352-row vocabulary (mlx-lm masks ids up to 100351), of which only
//! the first rows are random; the committed fixture keeps those rows and [`materialize`] pads
//! the embedding back with the zero rows mlx-lm saved. The goldens keep the first `rows`
//! logits columns; every other column must be 0, the dummy ids -inf (as the script checked of
//! mlx-lm's logits).

use std::path::{Path, PathBuf};

use mlx_core::testing::Goldens;
use mlx_core::{io, ops, Array, Dtype};
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::LanguageModel;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// The compact fixture `name` written out as a full model directory under the target's
/// temporary directory (the embedding padded with zero rows to `vocab_size`).
fn materialize(name: &str) -> PathBuf {
    let src = root().join("models/phi3small").join(name);
    let dst = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("phi3small_{name}"));
    std::fs::create_dir_all(&dst).unwrap();
    let config = std::fs::read_to_string(src.join("config.json")).unwrap();
    let vocab = serde_json::from_str::<serde_json::Value>(&config).unwrap()["vocab_size"]
        .as_i64()
        .unwrap() as i32;
    let (mut arrays, meta) = io::load_safetensors(src.join("model.safetensors"), None).unwrap();
    let key = "model.embed_tokens.weight";
    let emb = arrays.remove(key).unwrap();
    let s = emb.shape();
    let pad = ops::zeros(&[vocab - s[0], s[1]], emb.dtype(), None).unwrap();
    let full = ops::concatenate(&[&emb, &pad], 0, None).unwrap();
    arrays.insert(key.to_string(), full);
    io::save_safetensors(
        dst.join("model.safetensors"),
        arrays.iter().map(|(k, v)| (k.as_str(), v)),
        &meta,
    )
    .unwrap();
    std::fs::write(dst.join("config.json"), config).unwrap();
    dst
}

/// Our logits cut to the golden's columns, after checking the rest: 0, the dummy ids -inf.
fn cut(logits: &Array, rows: i32) -> Result<Array, String> {
    let s = logits.shape();
    let v = s[s.len() - 1];
    let tail = logits
        .slice_axis(-1, rows, v)
        .and_then(|t| t.astype(Dtype::Float32))
        .and_then(|t| t.to_vec::<f32>())
        .map_err(|e| e.to_string())?;
    let width = (v - rows) as usize;
    for (i, x) in tail.iter().enumerate() {
        let id = rows as usize + i % width;
        let dummy = [100256, 100258, 100259, 100260, 100264, 100265].contains(&id)
            || (100267..100352).contains(&id);
        let want = if dummy { f32::NEG_INFINITY } else { 0.0 };
        if x.to_bits() != want.to_bits() {
            return Err(format!("logit of id {id} is {x}, mlx-lm's is {want}"));
        }
    }
    logits.slice_axis(-1, 0, rows).map_err(|e| e.to_string())
}

fn check(model: &dyn LanguageModel, golden: &Path) -> Result<(), String> {
    let g = Goldens::load(golden).map_err(|e| e.to_string())?;
    let rows: i32 = g.metadata()["rows"].parse().unwrap();
    let mut caches = model.make_cache();
    let err = |e: mlx_models::ModelError| e.to_string();
    let mut fed = Vec::new();
    for s in -1.. {
        let name = if s < 0 {
            "prefill".to_string()
        } else {
            format!("step{s}")
        };
        let Ok(case) = g.case(&name) else { break };
        let ids = case.input(0).unwrap();
        if s >= 0 {
            fed.push(ids.to_vec::<i32>().unwrap()[0]);
        }
        let logits = model.forward(ids, Some(&mut caches)).map_err(err)?;
        case.check(&[cut(&logits, rows)?])
            .map_err(|e| format!("{name}: {e}"))?;
    }
    let full = g.case("full").map_err(|e| e.to_string())?;
    let logits = model.forward(full.input(0).unwrap(), None).map_err(err)?;
    full.check(&[cut(&logits, rows)?])
        .map_err(|e| format!("full: {e}"))?;
    let greedy: Vec<i32> = g.metadata()["greedy"]
        .split(',')
        .map(|x| x.parse().unwrap())
        .collect();
    if fed != greedy {
        return Err(format!("greedy ids {fed:?} vs {greedy:?}"));
    }
    Ok(())
}

#[test]
fn phi3small_matches_mlx_lm_bit_for_bit() {
    let mut failures = Vec::new();
    for name in ["phi3small", "phi3small_bf16"] {
        let dir = materialize(name);
        let (model, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
        let golden = root()
            .join("goldens/phi3small")
            .join(format!("{name}.safetensors"));
        if let Err(e) = check(model.as_ref(), &golden) {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn phi3small_is_a_dedicated_port() {
    let all = mlx_models::models::supported_model_types();
    let s = all.iter().find(|s| s.model_type == "phi3small");
    assert_eq!(
        s.map(|s| s.serving),
        Some(mlx_models::models::Serving::Dedicated)
    );
}

#[test]
fn phi3small_refuses_a_vocabulary_below_the_dummy_ids() {
    let src = root().join("models/phi3small/phi3small");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("phi3small_small_vocab");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["vocab_size"] = 128.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let err = match load_model_dir(&dir, &LoadOptions::default()) {
        Ok(_) => panic!("loaded phi3small with 128 ids"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("`vocab_size`") && err.contains("100351"),
        "{err}"
    );
}
