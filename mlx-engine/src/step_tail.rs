//! The end of one generation step for one row, shared by single and batched generation (a
//! single stream is one row): the token count (an ending EOS token included, as mlx-lm counts
//! it), the EOS and token-limit checks, the streaming detokenizer, stop strings, and the
//! token's log-probability and top-k alternatives. Each caller turns the [`Tail`] into its own
//! event ([`crate::stream::GenerationResponse`], [`crate::batch::BatchEvent`]).
//!
//! Only the text's chunking differs, by [`Chunking`]: what each side's goldens pin (the CLI's
//! and `stream_generate`'s responses, the server's streamed chunks).

use mlx_core::prelude::*;

use crate::error::Result;
use crate::tokenizer::Tokenizer;
use crate::tokenizer_stream::StreamingDetokenizer;

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An EOS token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// How a row's text is split into chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Chunking {
    /// [`crate::stream::stream_generate`]: holds back the longest stop string's length minus
    /// one; the last token (at the token limit) finalizes the detokenizer before its text is
    /// taken, so its response carries all the rest.
    Stream,
    /// The batch engine: holds back only a tail that could still begin a stop string; the last
    /// token's text is taken as any other's and what finalizing adds goes after it
    /// ([`Tail::Token`]'s `rest`, the `Done` event's text).
    Batch,
}

/// What a token did to its row.
#[derive(Debug, PartialEq)]
pub(crate) enum Tail {
    /// An EOS token ended the row (it is counted, not detokenized): `text` is what was still
    /// held back.
    Eos { text: String },
    /// A token and the text it lets out; `finish` is set when it ends the row (`Stop`: the
    /// text ends before a stop string). `rest`: text after the token's, at the token limit
    /// under [`Chunking::Batch`] (empty otherwise).
    Token {
        text: String,
        finish: Option<FinishReason>,
        rest: String,
    },
}

/// One row's state across its steps.
pub(crate) struct StepTail {
    detok: StreamingDetokenizer,
    stops: Vec<String>,
    full: String,
    emitted: usize,
    chunking: Chunking,
    max_tokens: Option<usize>,
    /// Tokens generated so far, an ending EOS token included.
    generated: usize,
}

impl StepTail {
    /// `max_tokens`: `None` is no limit.
    pub fn new(
        tokenizer: &Tokenizer,
        stops: Vec<String>,
        max_tokens: Option<usize>,
        chunking: Chunking,
    ) -> Self {
        StepTail {
            detok: tokenizer.detokenizer(),
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            full: String::new(),
            emitted: 0,
            chunking,
            max_tokens,
            generated: 0,
        }
    }

    /// Tokens generated so far, an ending EOS token included (mlx-lm's count).
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Hands the row its next token (`eos`: one of the tokenizer's EOS ids).
    pub fn step(&mut self, token: u32, eos: bool) -> Result<Tail> {
        self.generated += 1;
        if eos {
            return Ok(Tail::Eos {
                text: self.finish()?.0,
            });
        }
        self.detok.add_token(token);
        let last = self.max_tokens.is_some_and(|m| self.generated >= m);
        if last && self.chunking == Chunking::Stream {
            let (text, stopped) = self.finish()?;
            let finish = if stopped {
                FinishReason::Stop
            } else {
                FinishReason::Length
            };
            return Ok(Tail::Token {
                text,
                finish: Some(finish),
                rest: String::new(),
            });
        }
        self.full.push_str(&self.detok.last_segment()?);
        let (text, stopped) = self.take(false);
        let (finish, rest) = if stopped {
            (Some(FinishReason::Stop), String::new())
        } else if last {
            (Some(FinishReason::Length), self.finish()?.0)
        } else {
            (None, String::new())
        };
        Ok(Tail::Token { text, finish, rest })
    }

    /// Ends the row where its token source ended before it did: the text still held back.
    pub fn end(&mut self) -> Result<String> {
        Ok(self.finish()?.0)
    }

    /// Ends the text: everything still held back (up to a stop string: `true`).
    fn finish(&mut self) -> Result<(String, bool)> {
        self.detok.finalize()?;
        self.full.push_str(&self.detok.last_segment()?);
        Ok(self.take(true))
    }

    /// Bytes at the end of the text that could still grow into a stop string: the longest
    /// suffix (after what was emitted) that is a proper prefix of one.
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

    /// The text that can be sent now: up to the first stop string (`true`: the row stops
    /// there), else all but what [`Chunking`] holds back (cut back to a character boundary).
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
        let hold = match (finished, self.chunking) {
            (true, _) => 0,
            (false, Chunking::Stream) => self
                .stops
                .iter()
                .map(|s| s.len().saturating_sub(1))
                .max()
                .unwrap_or(0),
            (false, Chunking::Batch) => self.possible_stop_start(),
        };
        let end =
            floor_char_boundary(&self.full, self.full.len().saturating_sub(hold)).max(self.emitted);
        let out = self.full[self.emitted..end].to_string();
        self.emitted = end;
        (out, false)
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// A token's log-probability (`known`, else read from the step's `(vocab,)`
/// log-probabilities) and the `top` most likely `(id, logprob)` pairs of its step, most likely
/// first (none where the step carries no log-probabilities). The float32 copy is made only
/// where something is read from it.
pub(crate) fn token_logprobs(
    logprobs: &Array,
    known: Option<f32>,
    token: u32,
    top: usize,
) -> Result<(f32, Vec<(u32, f32)>)> {
    let mut f32s = None;
    let mut lp = || -> Result<Array> {
        if f32s.is_none() {
            f32s = Some(logprobs.astype(Dtype::Float32)?);
        }
        Ok(f32s.clone().expect("set above"))
    };
    let logprob = match known {
        Some(v) => v,
        None => ops::take(&lp()?, &Array::from_slice(&[token as i32], &[1])?, 0, None)?
            .to_vec::<f32>()?[0],
    };
    let pairs = if top > 0 {
        let lp = lp()?;
        if lp.size() > 0 {
            top_logprobs(&lp, top)?
        } else {
            Vec::new()
        }
    } else {
        Vec::new()
    };
    Ok((logprob, pairs))
}

/// The `top` most likely `(id, logprob)` pairs of a step's float32 log-probabilities, most
/// likely first (at most as many as there are ids).
fn top_logprobs(lp: &Array, top: usize) -> Result<Vec<(u32, f32)>> {
    let k = (top as i32).min(lp.size() as i32);
    let order = ops::argsort(&ops::negative(lp, None)?, -1, None)?;
    let idx = ops::slice_axis(&order, 0, 0, k, None)?;
    let vals = ops::take(lp, &idx, 0, None)?.to_vec::<f32>()?;
    Ok(idx.to_vec::<u32>()?.into_iter().zip(vals).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tail(stops: &[&str], chunking: Chunking) -> StepTail {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny_chat");
        let tok = Tokenizer::from_dir(dir).unwrap();
        StepTail::new(
            &tok,
            stops.iter().map(|s| s.to_string()).collect(),
            None,
            chunking,
        )
    }

    /// Pushes text as it would arrive from the detokenizer.
    fn push_text(t: &mut StepTail, text: &str) -> (String, bool) {
        t.full.push_str(text);
        t.take(false)
    }

    #[test]
    fn the_batch_holds_back_only_what_could_become_a_stop_string() {
        let mut t = tail(&["STOP here"], Chunking::Batch);
        // Nothing of this can start the stop string: all of it goes out at once.
        assert_eq!(push_text(&mut t, "hello wor"), ("hello wor".into(), false));
        assert_eq!(push_text(&mut t, "ld. ST"), ("ld. ".into(), false));
        // The held "ST" turns out not to be the stop string.
        assert_eq!(push_text(&mut t, "AR"), ("STAR".into(), false));
        assert_eq!(push_text(&mut t, " STOP h"), (" ".into(), false));
        assert_eq!(push_text(&mut t, "ere!"), ("".into(), true));
        let mut t = tail(&["ab", "xyz"], Chunking::Batch);
        assert_eq!(push_text(&mut t, "cx"), ("c".into(), false));
        assert_eq!(push_text(&mut t, "ya"), ("xy".into(), false));
        assert_eq!(push_text(&mut t, "q"), ("aq".into(), false));
        assert_eq!(t.finish().unwrap(), (String::new(), false));
    }

    #[test]
    fn the_stream_holds_back_the_longest_stop_string_minus_one() {
        let mut t = tail(&["STOP here", "ab"], Chunking::Stream);
        assert_eq!(push_text(&mut t, "hello wor"), ("h".into(), false));
        assert_eq!(push_text(&mut t, "ld. ST"), ("ello w".into(), false));
        assert_eq!(
            push_text(&mut t, "AR STOP here"),
            ("orld. STAR ".into(), true)
        );
    }
}
