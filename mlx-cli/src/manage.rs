//! `mlx manage`: the Hugging Face cache's models, listed or deleted (as `mlx_lm.manage`).

use std::io::{BufRead, Write};
use std::time::SystemTime;

use clap::Args;
use mlx_engine::hub::{self, CachedRepo};

#[derive(Args, Debug)]
pub struct ManageArgs {
    /// Scan the Hugging Face cache for models whose id contains the pattern.
    #[arg(long)]
    pub scan: bool,
    /// Delete the models whose id contains the pattern (asks first).
    #[arg(long)]
    pub delete: bool,
    /// Model repos contain the pattern.
    #[arg(long, default_value = "mlx")]
    pub pattern: String,
    /// Delete without asking.
    #[arg(short = 'y', long)]
    pub yes: bool,
}

/// Sizes as huggingface_hub prints them (`_format_size`: powers of 1000, one decimal).
fn format_size(n: u64) -> String {
    let mut f = n as f64;
    for unit in ["", "K", "M", "G", "T", "P", "E", "Z"] {
        if f.abs() < 1000.0 {
            return format!("{f:.1}{unit}");
        }
        f /= 1000.0;
    }
    format!("{f:.1}Y")
}

/// Times as huggingface_hub prints them (`_format_timesince`).
fn format_since(t: Option<SystemTime>) -> String {
    let Some(t) = t else {
        return "unknown".into();
    };
    let delta = SystemTime::now()
        .duration_since(t)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    if delta < 20.0 {
        return "a few seconds ago".into();
    }
    const CHUNKS: [(&str, f64, Option<f64>); 7] = [
        ("second", 1.0, Some(60.0)),
        ("minute", 60.0, Some(60.0)),
        ("hour", 3600.0, Some(24.0)),
        ("day", 86400.0, Some(6.0)),
        ("week", 604800.0, Some(6.0)),
        ("month", 2592000.0, Some(11.0)),
        ("year", 31536000.0, None),
    ];
    let (mut value, mut label) = (0.0, "second");
    for (l, div, max) in CHUNKS {
        value = (delta / div).round();
        label = l;
        if max.is_some_and(|m| value <= m) {
            break;
        }
    }
    format!("{value} {label}{} ago", if value > 1.0 { "s" } else { "" })
}

/// mlx_lm.manage's table: columns padded to their widest cell, a dashed rule under the header.
fn tabulate(rows: &[Vec<String>], headers: &[&str]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$} "))
            .collect::<String>()
    };
    let mut out = vec![
        line(headers.iter().map(|h| h.to_string()).collect()),
        line(widths.iter().map(|w| "-".repeat(*w)).collect()),
    ];
    out.extend(rows.iter().map(|r| line(r.clone())));
    out.join("\n")
}

fn matching(pattern: &str) -> Result<Vec<CachedRepo>, String> {
    let cache = hub::cache_dir();
    Ok(hub::scan_cache(&cache)
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|r| r.repo_id.contains(pattern))
        .collect())
}

pub fn run(a: &ManageArgs) -> Result<(), String> {
    if !a.scan && !a.delete {
        return Err("mlx manage: give --scan or --delete".into());
    }
    let mut out = std::io::stdout().lock();
    let w = |e: std::io::Error| e.to_string();
    if a.scan {
        writeln!(
            out,
            "Scanning Hugging Face cache for models with pattern \"{}\".",
            a.pattern
        )
        .map_err(w)?;
        let rows: Vec<Vec<String>> = matching(&a.pattern)?
            .iter()
            .map(|r| {
                vec![
                    r.repo_id.clone(),
                    r.repo_type.clone(),
                    format!("{:>12}", format_size(r.size_on_disk)),
                    r.nb_files.to_string(),
                    format_since(r.last_accessed),
                    format_since(r.last_modified),
                    r.path.display().to_string(),
                ]
            })
            .collect();
        let headers = [
            "REPO ID",
            "REPO TYPE",
            "SIZE ON DISK",
            "NB FILES",
            "LAST_ACCESSED",
            "LAST_MODIFIED",
            "LOCAL PATH",
        ];
        writeln!(out, "{}", tabulate(&rows, &headers)).map_err(w)?;
    }
    if a.delete {
        writeln!(out, "Deleting models matching pattern \"{}\"", a.pattern).map_err(w)?;
        let repos = matching(&a.pattern)?;
        if repos.is_empty() {
            writeln!(out, "No models found matching pattern \"{}\"", a.pattern).map_err(w)?;
            return Ok(());
        }
        let rows: Vec<Vec<String>> = repos
            .iter()
            .map(|r| {
                vec![
                    r.repo_id.clone(),
                    format_size(r.size_on_disk),
                    r.path.display().to_string(),
                ]
            })
            .collect();
        writeln!(out, "\nFound the following models:").map_err(w)?;
        writeln!(
            out,
            "{}",
            tabulate(&rows, &["REPO ID", "SIZE", "LOCAL PATH"])
        )
        .map_err(w)?;
        let confirmed = a.yes || ask("\nAre you sure you want to delete these models?")?;
        if confirmed {
            for r in &repos {
                writeln!(out, "\nDeleting {}...", r.repo_id).map_err(w)?;
                hub::delete_repo(r).map_err(|e| e.to_string())?;
            }
            writeln!(out, "\nModel(s) deleted successfully.").map_err(w)?;
        } else {
            writeln!(out, "\nDeletion cancelled - no changes made.").map_err(w)?;
        }
    }
    Ok(())
}

/// mlx_lm.manage's y/n question; end of input answers no.
fn ask(message: &str) -> Result<bool, String> {
    let stdin = std::io::stdin();
    loop {
        print!("{message} (y/n) ");
        let _ = std::io::stdout().flush();
        let mut line = String::new();
        if stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| e.to_string())?
            == 0
        {
            return Ok(false);
        }
        match line.trim().to_lowercase().as_str() {
            "y" | "yes" | "1" => return Ok(true),
            "n" | "no" | "0" | "" => return Ok(false),
            _ => println!("Invalid input. Must be one of: yes/no/y/n or empty for no"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_times_as_huggingface_hub_prints_them() {
        assert_eq!(format_size(0), "0.0");
        assert_eq!(format_size(999), "999.0");
        assert_eq!(format_size(1_234_567), "1.2M");
        assert_eq!(format_since(Some(SystemTime::now())), "a few seconds ago");
        let two_days = SystemTime::now() - std::time::Duration::from_secs(2 * 86400);
        assert_eq!(format_since(Some(two_days)), "2 days ago");
    }
}
