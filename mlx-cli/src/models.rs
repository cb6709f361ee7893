//! `mlx models`: every supported `model_type` and how it is served.

use std::io::Write;

use clap::Args;
use mlx_models::models::unserved::{Unserved, UNSERVED};
use mlx_models::models::{supported_model_types, Serving};

#[derive(Args, Debug)]
pub struct ModelsArgs {
    /// Print one JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &ModelsArgs) -> Result<(), String> {
    let all = supported_model_types();
    let mut out = std::io::stdout().lock();
    let serving = |s: Serving| match s {
        Serving::Table => "table",
        Serving::Dedicated => "dedicated",
    };
    let why = |u: Unserved| match u {
        Unserved::NoCpu => "no-cpu",
        Unserved::NotYet => "not-yet",
    };
    if a.json {
        // Served types, then mlx-lm's types not served (`serving` "none", with the reason).
        let rows: Vec<serde_json::Value> = all
            .iter()
            .map(|t| {
                serde_json::json!({
                    "model_type": t.model_type,
                    "serving": serving(t.serving),
                    "via": t.via,
                })
            })
            .chain(UNSERVED.iter().map(|(t, u, reason)| {
                serde_json::json!({
                    "model_type": t,
                    "serving": "none",
                    "via": null,
                    "unserved": why(*u),
                    "reason": reason,
                })
            }))
            .collect();
        // A closed pipe (`mlx models --json | head`) ends the listing quietly.
        writeln!(out, "{}", serde_json::Value::Array(rows)).ok();
        return Ok(());
    }
    for t in &all {
        let line = match &t.via {
            Some(v) => writeln!(out, "{:<20} {} (as {v})", t.model_type, serving(t.serving)),
            None => writeln!(out, "{:<20} {}", t.model_type, serving(t.serving)),
        };
        if line.is_err() {
            return Ok(());
        }
    }
    writeln!(out, "{} model types", all.len()).ok();
    writeln!(out, "\nnot served ({}):", UNSERVED.len()).ok();
    for (t, u, reason) in UNSERVED {
        let what = match u {
            Unserved::NoCpu => "cannot run on MLX's CPU backend",
            Unserved::NotYet => "not yet",
        };
        if writeln!(out, "{t:<20} {what}: {reason}").is_err() {
            return Ok(());
        }
    }
    Ok(())
}
