//! L1 against mlx-lm 0.32.2 `rope_utils.initialize_rope` for every scaling scheme (goldens from
//! `cargo xtask goldens rope`): the same outputs bit for bit at two offsets in float32 and
//! bfloat16, and an error wherever mlx-lm raises.

use std::path::PathBuf;

use mlx_core::testing::{Case, Goldens};
use mlx_models::layers::{Rope, RopeScaling};

fn build(c: &Case) -> Result<Rope, String> {
    let cfg: Option<RopeScaling> = if c.has("config") {
        Some(serde_json::from_str(c.str("config").unwrap()).map_err(|e| e.to_string())?)
    } else {
        None
    };
    let max_pos = c
        .has("max_position_embeddings")
        .then(|| c.int("max_position_embeddings").unwrap());
    Rope::initialize(
        16,
        c.float("base").unwrap(),
        c.bool("traditional").unwrap(),
        cfg.as_ref(),
        max_pos,
    )
    .map_err(|e| e.to_string())
}

#[test]
fn rope_matches_initialize_rope_for_every_scaling() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/goldens/rope.safetensors");
    let g = Goldens::load(path).unwrap();
    let cases = g.cases().unwrap();
    assert!(cases.len() >= 28);
    let mut failures = Vec::new();
    for c in &cases {
        let r = match c.op.as_str() {
            "rope_error" => match build(c) {
                Ok(_) => Err(format!(
                    "accepted; mlx-lm raises {}",
                    c.str("error").unwrap()
                )),
                Err(_) => Ok(()),
            },
            _ => build(c).and_then(|rope| {
                let x = c.input(0).unwrap();
                let outs = c
                    .ints("offsets")
                    .unwrap()
                    .into_iter()
                    .map(|o| rope.forward(x, o as usize).map_err(|e| e.to_string()))
                    .collect::<Result<Vec<_>, _>>()?;
                c.check(&outs)
            }),
        };
        if let Err(e) = r {
            failures.push(format!("{}: {e}", c.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
