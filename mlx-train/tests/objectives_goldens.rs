//! DPO and ORPO against the MLX reference in `xtask/oracle/goldens_train.py` (mlx-lm has
//! neither): preference data tokenized and batched here equals the oracle's batches, and for
//! three Adam steps the loss, the token count and every LoRA gradient are equal bit for bit,
//! as are the adapters after them. DPO's reference is the model with its adapters off.

use std::path::PathBuf;

use mlx_core::prelude::*;
use mlx_core::testing::{assert_bit_equal, Goldens};
use mlx_models::load::{load_model_dir, LoadOptions};
use mlx_models::LanguageModel;
use mlx_train::data::{load_local_dataset, pad_batch, Batch, DataConfig};
use mlx_train::lora::{linear_to_lora_layers, LoraConfig};
use mlx_train::objectives::{dpo_loss, orpo_loss, reference_logps};
use mlx_train::optim::{LearningRate, Method, Optimizer};
use mlx_train::trainer::loss_and_grad;
use mlx_train::{tokenize, Params};

fn tests() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn check(objective: &'static str) {
    let g = Goldens::load(tests().join(format!("goldens/train_{objective}.safetensors"))).unwrap();
    let dir = tests().join("models/dense");
    let tok = tokenize::load(&dir).unwrap();
    let (train, _, _) = load_local_dataset(
        &tests().join("data/preference"),
        &tok,
        &DataConfig::default(),
    )
    .unwrap();
    let (mut model, _) = load_model_dir(&dir, &LoadOptions::default()).unwrap();
    random::seed(5).unwrap();
    let params = Params::new();
    let lora = LoraConfig {
        rank: 4,
        scale: 10.0,
        dropout: 0.0,
        keys: None,
    };
    linear_to_lora_layers(model.as_mut(), 2, &lora, false, &params).unwrap();
    params.set_training(true);
    let adam = Method::from_config("adam", &Default::default()).unwrap();
    let mut opt = Optimizer::new(adam, LearningRate::Constant(1e-2)).unwrap();
    let mut names = Vec::new();
    for i in 0..3 {
        let case = g.case(&format!("step{i}")).unwrap();
        let ex: Vec<_> = train.examples[2 * i..2 * i + 2].iter().collect();
        let batch: Batch = pad_batch(&ex, 2, 2048).unwrap();
        assert_bit_equal(&batch.tokens, case.input(0).unwrap()).unwrap();
        assert_bit_equal(&batch.lengths, case.input(1).unwrap()).unwrap();
        let beta = case.float("beta").unwrap();
        let p2 = params.clone();
        let loss = move |m: &dyn LanguageModel, b: &Array, l: &Array| match objective {
            "dpo" => {
                let r = reference_logps(m, &p2, b, l)?;
                dpo_loss(m, b, l, &r, beta)
            }
            _ => orpo_loss(m, b, l, beta),
        };
        let (l, n, grads) = loss_and_grad(model.as_ref(), &params, &loss, &batch).unwrap();
        assert_bit_equal(&l, &case.outputs[0]).unwrap_or_else(|m| panic!("step {i} loss: {m}"));
        assert_bit_equal(&n, &case.outputs[1]).unwrap();
        names = case.params["names"]
            .trim_matches(['[', ']'])
            .split(',')
            .map(str::to_string)
            .collect();
        assert_eq!(grads.len(), names.len());
        for (j, k) in names.iter().enumerate() {
            assert_bit_equal(&grads[k], &case.outputs[2 + j])
                .unwrap_or_else(|m| panic!("step {i} grad {k}: {m}"));
        }
        let new = opt.apply_gradients(&grads, &params.snapshot()).unwrap();
        params.update(&new).unwrap();
        let mut all: Vec<Array> = params.snapshot().into_values().collect();
        all.extend(opt.state_arrays());
        eval(&all).unwrap();
    }
    let fin = g.case("final").unwrap();
    let snap = params.snapshot();
    for (j, k) in names.iter().enumerate() {
        assert_bit_equal(&snap[k], &fin.outputs[j]).unwrap_or_else(|m| panic!("final {k}: {m}"));
    }
}

static SEEDED: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn dpo_matches_reference() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    check("dpo");
}

#[test]
fn orpo_matches_reference() {
    let _g = SEEDED.lock().unwrap_or_else(|p| p.into_inner());
    check("orpo");
}
