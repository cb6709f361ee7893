//! Errors name the failure in typed variants (issue #29): the field and the problem of a bad
//! option, the section and name of an unknown one, with the message users always saw.

use mlx_train::optim::Method;
use mlx_train::TrainError;

fn cfg(j: &str) -> serde_json::Map<String, serde_json::Value> {
    serde_json::from_str(j).unwrap()
}

#[test]
fn a_bad_optimizer_option_names_its_field_and_problem() {
    let e = Method::from_config("muon", &cfg(r#"{"nesterov": "yes"}"#)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "optimizer_config.muon.nesterov must be a boolean"
    );
    match e {
        TrainError::Option { field, problem } => {
            assert_eq!(field, "optimizer_config.muon.nesterov");
            assert_eq!(problem, "must be a boolean");
        }
        other => panic!("not an option error: {other:?}"),
    }
    let e = Method::from_config("adafactor", &cfg(r#"{"eps": [1e-30, "x"]}"#)).unwrap_err();
    assert!(
        matches!(&e, TrainError::Option { field, .. } if field == "optimizer_config.adafactor.eps[1]"),
        "{e:?}"
    );
}

#[test]
fn an_unknown_optimizer_option_names_its_section_and_name() {
    let e = Method::from_config("muon", &cfg(r#"{"betas": [0.9, 0.99]}"#)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "optimizer_config.muon: unknown option `betas`"
    );
    match e {
        TrainError::UnknownOption { section, option } => {
            assert_eq!(
                (section.as_str(), option.as_str()),
                ("optimizer_config.muon", "betas")
            );
        }
        other => panic!("not an unknown-option error: {other:?}"),
    }
}

#[test]
fn typed_model_errors_of_the_adapters_keep_their_messages() {
    use mlx_models::ModelError;
    let e = ModelError::Parameters {
        path: "model.layers.0.self_attn.q_proj".into(),
        problem: "2 values for 3 parameters".into(),
    };
    assert_eq!(
        e.to_string(),
        "model.layers.0.self_attn.q_proj: 2 values for 3 parameters"
    );
    // An adapter's own error travels as the source, downcastable to the trainer's type.
    let e = ModelError::Adapter(Box::new(TrainError::option(
        "batch_size",
        "must be positive",
    )));
    assert_eq!(e.to_string(), "batch_size must be positive");
    match &e {
        ModelError::Adapter(src) => assert!(src.downcast_ref::<TrainError>().is_some()),
        other => panic!("{other:?}"),
    }
}
