//! The text side of one sequence in a batch: streaming detokenization and stop strings, with
//! the rules of [`crate::stream::stream_generate`] (text is held back while it could still
//! begin a stop string; generation stops before the first stop string).

use crate::error::Result;
use crate::tokenizer::Tokenizer;
use crate::tokenizer_stream::StreamingDetokenizer;

pub(crate) struct TextState {
    detok: StreamingDetokenizer,
    stops: Vec<String>,
    full: String,
    emitted: usize,
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
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

    fn take(&mut self, finished: bool) -> (String, bool) {
        if let Some(pos) = self
            .stops
            .iter()
            .filter_map(|s| self.full.find(s.as_str()))
            .min()
        {
            let out = self.full[self.emitted.min(pos)..pos].to_string();
            self.emitted = pos;
            return (out, true);
        }
        let hold = if finished {
            0
        } else {
            self.stops
                .iter()
                .map(|s| s.len().saturating_sub(1))
                .max()
                .unwrap_or(0)
        };
        let end =
            floor_char_boundary(&self.full, self.full.len().saturating_sub(hold)).max(self.emitted);
        let out = self.full[self.emitted..end].to_string();
        self.emitted = end;
        (out, false)
    }
}
