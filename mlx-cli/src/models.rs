//! `mlx models`: every supported `model_type` and how it is served.

use clap::Args;
use mlx_models::models::{supported_model_types, Serving};

#[derive(Args, Debug)]
pub struct ModelsArgs {
    /// Print one JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &ModelsArgs) -> Result<(), String> {
    let all = supported_model_types();
    let serving = |s: Serving| match s {
        Serving::Table => "table",
        Serving::Dedicated => "dedicated",
    };
    if a.json {
        let rows: Vec<serde_json::Value> = all
            .iter()
            .map(|t| {
                serde_json::json!({
                    "model_type": t.model_type,
                    "serving": serving(t.serving),
                    "via": t.via,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
        return Ok(());
    }
    for t in &all {
        match &t.via {
            Some(v) => println!("{:<20} {} (as {v})", t.model_type, serving(t.serving)),
            None => println!("{:<20} {}", t.model_type, serving(t.serving)),
        }
    }
    println!("{} model types", all.len());
    Ok(())
}
