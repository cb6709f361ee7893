//! Progress bars on stderr (indicatif): the default model's first download, and the prefill of
//! long prompts. indicatif draws only on a terminal; when stderr is a log or a pipe, the
//! download prints one line when it starts and one when it ends, and the prefill nothing.

use std::io::IsTerminal;
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mlx_engine::fetch::FetchProgress;
use mlx_engine::generate::PromptProgress;

fn bar(total: Option<u64>, template: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(template) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}

/// The download bar of the default model's first use, fed [`FetchProgress`] reports.
pub struct DownloadBar {
    tty: bool,
    bar: Option<ProgressBar>,
    file: String,
    bytes: u64,
}

impl DownloadBar {
    pub fn new() -> DownloadBar {
        DownloadBar {
            tty: std::io::stderr().is_terminal(),
            bar: None,
            file: String::new(),
            bytes: 0,
        }
    }

    pub fn update(&mut self, p: &FetchProgress) {
        match p {
            FetchProgress::Verifying | FetchProgress::Resolving { .. } => {}
            FetchProgress::Downloading { file, total } => {
                self.file = file.clone();
                if self.tty {
                    let pb = bar(
                        *total,
                        "[mlx] {msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec}",
                    );
                    pb.set_message(file.clone());
                    self.bar = Some(pb);
                } else {
                    let size = total
                        .map(|t| format!(" ({:.1} MB)", t as f64 / 1e6))
                        .unwrap_or_default();
                    eprintln!("[mlx] downloading {file}{size} ...");
                }
            }
            FetchProgress::Downloaded { bytes, total } => {
                self.bytes = *bytes;
                if let Some(pb) = &self.bar {
                    if let Some(t) = total {
                        pb.set_length((*t).max(*bytes));
                    }
                    pb.set_position(*bytes);
                }
            }
            FetchProgress::Extracting => self.finish(),
        }
    }

    /// Ends the bar (or prints the summary line when stderr is not a terminal).
    pub fn finish(&mut self) {
        if let Some(pb) = self.bar.take() {
            pb.finish();
        } else if !self.tty && !self.file.is_empty() {
            eprintln!("[mlx] downloaded {:.1} MB", self.bytes as f64 / 1e6);
            self.file.clear();
        }
    }
}

impl Drop for DownloadBar {
    /// A failed download leaves the bar where it stopped, the cursor on a fresh line.
    fn drop(&mut self) {
        if let Some(pb) = self.bar.take() {
            pb.abandon();
        }
    }
}

/// Prompts shorter than this show no prefill bar.
const PREFILL_BAR_MIN_TOKENS: usize = 4096;

/// A prefill bar for a prompt of `total` tokens (none for short prompts or off a terminal), as
/// the `prompt_progress` callback of `generate_step`; it clears itself when the prompt is done.
pub fn prefill_bar(total: usize) -> Option<PromptProgress> {
    if total < PREFILL_BAR_MIN_TOKENS || !std::io::stderr().is_terminal() {
        return None;
    }
    let pb = bar(
        Some(total as u64),
        "[mlx] prefill [{bar:30}] {pos}/{len} tokens {per_sec}",
    );
    Some(PromptProgress(Arc::new(
        move |done: usize, total: usize| {
            if pb.is_finished() {
                return;
            }
            pb.set_length(total as u64);
            pb.set_position(done as u64);
            if done >= total {
                pb.finish_and_clear();
            }
        },
    )))
}
