//! The text side of one sequence in a batch: streaming detokenization and stop strings.
//! Generation stops before the first stop string, as in [`crate::stream::stream_generate`];
//! only the tail of the text that is a prefix of a stop string is held back (the longest
//! such tail), so a server streams the rest with the token that made it.

use crate::error::Result;
use crate::tokenizer::Tokenizer;
use crate::tokenizer_stream::StreamingDetokenizer;

pub(crate) struct TextState {
    detok: StreamingDetokenizer,
    stops: Vec<String>,
    full: String,
    emitted: usize,
}

impl TextState {
    pub fn new(tokenizer: &Tokenizer, stops: Vec<String>) -> Self {
        TextState {
            detok: tokenizer.detokenizer(),
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            full: String::new(),
            emitted: 0,
        }
    }

    /// Adds a generated token; returns the text that can be sent now and whether a stop
    /// string was reached (the text then ends before it).
    pub fn push(&mut self, token: u32) -> Result<(String, bool)> {
        self.detok.add_token(token);
        self.full.push_str(&self.detok.last_segment()?);
        Ok(self.take(false))
    }

    /// Ends the text (EOS or length): everything still held back.
    pub fn finish(&mut self) -> Result<String> {
        self.detok.finalize()?;
        self.full.push_str(&self.detok.last_segment()?);
        Ok(self.take(true).0)
    }

    /// Bytes at the end of the text that could still grow into a stop string: the longest
    /// suffix (after what was emitted) that is a proper prefix of one. Only these are held
    /// back; everything before them is sent at once.
    fn possible_stop_start(&self) -> usize {
        let tail = &self.full[self.emitted..];
        self.stops
            .iter()
            .map(|stop| {
                let longest = stop.len().saturating_sub(1).min(tail.len());
                (1..=longest)
                    .rev()
                    .find(|&k| {
                        tail.is_char_boundary(tail.len() - k)
                            && stop.starts_with(&tail[tail.len() - k..])
                    })
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0)
    }

    fn take(&mut self, finished: bool) -> (String, bool) {
        let hold = if finished {
            0
        } else {
            self.possible_stop_start()
        };
        crate::stream::take_text(&self.full, &mut self.emitted, &self.stops, hold)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(stops: &[&str]) -> TextState {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_chat");
        let tok = Tokenizer::from_dir(dir).unwrap();
        TextState::new(&tok, stops.iter().map(|s| s.to_string()).collect())
    }

    /// Pushes text as it would arrive from the detokenizer.
    fn push_text(t: &mut TextState, text: &str) -> (String, bool) {
        t.full.push_str(text);
        t.take(false)
    }

    #[test]
    fn holds_back_only_what_could_become_a_stop_string() {
        let mut t = state(&["STOP here"]);
        // Nothing of this can start the stop string: all of it goes out at once.
        assert_eq!(push_text(&mut t, "hello wor"), ("hello wor".into(), false));
        assert_eq!(push_text(&mut t, "ld. ST"), ("ld. ".into(), false));
        // The held "ST" turns out not to be the stop string.
        assert_eq!(push_text(&mut t, "AR"), ("STAR".into(), false));
        assert_eq!(push_text(&mut t, " STOP h"), (" ".into(), false));
        assert_eq!(push_text(&mut t, "ere!"), ("".into(), true));
        let mut t = state(&["ab", "xyz"]);
        assert_eq!(push_text(&mut t, "cx"), ("c".into(), false));
        assert_eq!(push_text(&mut t, "ya"), ("xy".into(), false));
        assert_eq!(push_text(&mut t, "q"), ("aq".into(), false));
        assert_eq!(t.finish().unwrap(), "");
    }
}
