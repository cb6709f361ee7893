//! The compiled optimizer update (`Optimizer::apply_gradients_compiled`, what `train` runs)
//! against the uncompiled one: every method, with a constant and a scheduled learning rate,
//! over several steps and a parameter set that changes (a new parameter joins, one leaves):
//! the parameters and the whole state must be equal bit for bit, and the update must really
//! run compiled.

use mlx_core::transforms::ParamMap;
use mlx_core::{random, Array, Dtype};
use mlx_train::optim::{build_schedule, LearningRate, Method, Optimizer, ScheduleConfig};

fn methods() -> Vec<(&'static str, serde_json::Value)> {
    vec![
        (
            "sgd",
            serde_json::json!({"momentum": 0.9, "weight_decay": 0.01, "nesterov": true}),
        ),
        ("adam", serde_json::json!({})),
        ("adamw", serde_json::json!({"weight_decay": 0.05})),
        ("muon", serde_json::json!({})),
        ("adafactor", serde_json::json!({"beta_1": 0.9})),
        ("adafactor", serde_json::json!({"relative_step": false})),
    ]
}

fn lr(scheduled: bool) -> LearningRate {
    if !scheduled {
        return LearningRate::Constant(1e-2);
    }
    let c: ScheduleConfig = serde_json::from_value(serde_json::json!({
        "name": "cosine_decay", "arguments": [1e-2, 10, 1e-4], "warmup": 2, "warmup_init": 1e-3
    }))
    .unwrap();
    LearningRate::Scheduled(build_schedule(&c).unwrap())
}

fn draw(shape: &[i32], dtype: Dtype, seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    random::normal(shape, dtype, None, None, Some(&key), None).unwrap()
}

fn bytes(m: &std::collections::BTreeMap<String, Array>) -> Vec<(String, Vec<u8>)> {
    m.iter()
        .map(|(k, a)| (k.clone(), a.to_bytes().unwrap()))
        .collect()
}

#[test]
fn compiled_update_equals_the_uncompiled_one_bit_for_bit() {
    let shapes: [(&str, &[i32], Dtype); 5] = [
        ("a.lora_a", &[16, 4], Dtype::Float32),
        ("a.lora_b", &[4, 8], Dtype::Float32),
        ("b.bias", &[8], Dtype::Bfloat16),
        ("c.weight", &[8, 12], Dtype::Bfloat16),
        ("d.weight", &[6, 10], Dtype::Float16),
    ];
    for (name, config) in methods() {
        for scheduled in [false, true] {
            let what = format!("{name} {config} scheduled={scheduled}");
            let method = Method::from_config(name, config.as_object().unwrap()).unwrap();
            let mut plain = Optimizer::new(method.clone(), lr(scheduled)).unwrap();
            let mut compiled = Optimizer::new(method, lr(scheduled)).unwrap();
            let mut params: ParamMap = shapes
                .iter()
                .enumerate()
                .map(|(i, (k, s, d))| (k.to_string(), draw(s, *d, i as u64)))
                .collect();
            let (mut p1, mut p2) = (params.clone(), params.clone());
            for step in 0..5u64 {
                // Steps 0-1 update two parameters, 2-3 all five (new ones join the state), 4
                // two again: the compiled update is retraced for each layout. Full
                // fine-tuning updates bf16 and f16 weights.
                let names: Vec<&str> = match step {
                    0 | 1 => vec!["a.lora_a", "a.lora_b"],
                    2 | 3 => vec!["a.lora_a", "a.lora_b", "b.bias", "c.weight", "d.weight"],
                    _ => vec!["a.lora_b", "b.bias"],
                };
                let grads: ParamMap = names
                    .iter()
                    .map(|k| {
                        let p = &params[*k];
                        (k.to_string(), draw(&p.shape(), p.dtype(), 100 + step))
                    })
                    .collect();
                let n1 = plain.apply_gradients(&grads, &p1).unwrap();
                let n2 = compiled.apply_gradients_compiled(&grads, &p2).unwrap();
                assert!(
                    compiled.is_update_compiled(),
                    "{what}: fell back to uncompiled"
                );
                assert_eq!(bytes(&n1), bytes(&n2), "{what}: parameters at step {step}");
                assert_eq!(
                    bytes(&plain.state_map()),
                    bytes(&compiled.state_map()),
                    "{what}: state at step {step}"
                );
                p1.extend(n1);
                p2.extend(n2);
            }
            params.clear();
        }
    }
}

#[test]
fn a_failing_compiled_update_changes_nothing_and_reports_the_error() {
    let method = Method::from_config("adam", &serde_json::Map::new()).unwrap();
    let mut opt = Optimizer::new(method, LearningRate::Constant(1e-2)).unwrap();
    let p: ParamMap = [("w".to_string(), draw(&[4, 4], Dtype::Float32, 1))].into();
    let g: ParamMap = [("w".to_string(), draw(&[4, 4], Dtype::Float32, 2))].into();
    opt.apply_gradients_compiled(&g, &p).unwrap();
    let before = bytes(&opt.state_map());
    // A gradient whose shape does not match its parameter: a clear error, not a panic, and
    // the state as it was.
    let bad: ParamMap = [("w".to_string(), draw(&[3, 4], Dtype::Float32, 3))].into();
    let err = opt.apply_gradients_compiled(&bad, &p);
    assert!(err.is_err());
    assert_eq!(before, bytes(&opt.state_map()));
    let ok = opt.apply_gradients_compiled(&g, &p).unwrap();
    assert_eq!(ok["w"].shape(), vec![4, 4]);
}
