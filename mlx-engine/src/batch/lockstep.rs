//! The engine under `mlx launch -- serve` (mlx_lm.server under mlx.launch): rank 0 serves
//! HTTP and every rank runs the same requests, in the same order and step for step, so the
//! collectives of a sharded model meet. How a message reaches every rank is the launcher's
//! business ([`Lockstep`], implemented in `mlx-cli` over MLX's collectives); what travels is
//! a [`Message`] as JSON.
//!
//! Under it the engine serves one request at a time to its end (`stream_generate`, as
//! `mlx generate` runs it); several choices (`n > 1`), grammars and embeddings are refused.
//! A request without a seed that samples (`temperature > 0`) gets one drawn by rank 0, so
//! every rank draws the same tokens (mlx_lm.server shares its random state the same way).

use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use super::engine::{BatchEvent, BatchRequest, EventSink};
use crate::sample::{ProcessorSettings, SamplerSettings};

/// How the ranks of a launched group share the engine's decisions.
pub trait Lockstep: Send + Sync {
    /// Whether this rank takes requests (rank 0).
    fn is_leader(&self) -> bool;
    /// Collective: rank 0's `msg` (`None`: nothing) reaches every rank; the others pass
    /// `None`. An error when a peer was lost.
    fn share(&self, msg: Option<&Message>) -> Result<Option<Message>, String>;
    /// A share failed (`error`): the ranks can no longer step together. The engine stops
    /// after this call; the launcher's implementation ends the process with the error, so
    /// rank 0 does not go on accepting requests it cannot run.
    fn lost(&self, error: &str) {
        let _ = error;
    }
}

/// What rank 0 tells the others.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub enum Message {
    /// Run this request.
    Run(Box<SharedRequest>),
    /// Stop the request under way (its client went away or its deadline passed).
    Stop,
    /// The server stopped: every rank's engine returns.
    Quit,
}

/// What a request asks that `mlx launch -- serve` does not serve (the request's error).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotUnderLaunch {
    #[error("several choices (n > 1) are not supported under mlx launch")]
    SeveralChoices,
    #[error("structured output is not supported under mlx launch")]
    Grammar,
}

/// A message from rank 0 that is not one this build reads.
#[derive(Debug, thiserror::Error)]
#[error("a shared engine message: {0}")]
pub struct BadMessage(#[from] serde_json::Error);

/// The part of a [`BatchRequest`] every rank needs to compute the same tokens.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SharedRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampler: SamplerSettings,
    pub processors: ProcessorSettings,
    pub stop_strings: Vec<String>,
    pub logprobs: bool,
    pub top_logprobs: usize,
    pub seed: Option<u64>,
    /// Only rank 0 reads it (it decides when to stop).
    pub timeout_ms: Option<u64>,
}

impl SharedRequest {
    /// The shared form of `r` (with `extra` further choices), or why it cannot be served
    /// under `mlx launch`.
    pub fn of(r: &BatchRequest, extra: usize) -> Result<SharedRequest, NotUnderLaunch> {
        if extra > 0 {
            return Err(NotUnderLaunch::SeveralChoices);
        }
        if r.grammar.is_some() {
            return Err(NotUnderLaunch::Grammar);
        }
        let seed = match r.seed {
            Some(s) => Some(s),
            None if r.sampler.temp > 0.0 => Some(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64),
            ),
            None => None,
        };
        Ok(SharedRequest::with_seed(r, seed))
    }

    /// `r`'s shared form with `seed` (what a request run one at a time reads).
    pub(crate) fn with_seed(r: &BatchRequest, seed: Option<u64>) -> SharedRequest {
        SharedRequest {
            prompt: r.prompt.clone(),
            max_tokens: r.max_tokens,
            sampler: r.sampler.clone(),
            processors: r.processors.clone(),
            stop_strings: r.stop_strings.clone(),
            logprobs: r.logprobs,
            top_logprobs: r.top_logprobs,
            seed,
            timeout_ms: r.timeout.map(|t| t.as_millis() as u64),
        }
    }
}

impl Message {
    pub fn to_bytes(&self) -> Vec<u8> {
        // A plain data enum: serialization cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
    pub fn from_bytes(b: &[u8]) -> Result<Message, BadMessage> {
        Ok(serde_json::from_slice(b)?)
    }
}

static LOCKSTEP: OnceLock<Arc<dyn Lockstep>> = OnceLock::new();

/// Makes every engine started afterwards in this process step with the other ranks (once per
/// process; a second call is ignored and returns `false`).
pub fn set(ls: Arc<dyn Lockstep>) -> bool {
    LOCKSTEP.set(ls).is_ok()
}

/// The process's lockstep, if set.
pub fn get() -> Option<Arc<dyn Lockstep>> {
    LOCKSTEP.get().cloned()
}

/// The events of a rank that serves nobody.
pub(crate) struct NullSink;

impl EventSink for NullSink {
    fn send(&mut self, _event: BatchEvent) -> bool {
        true
    }
    fn is_closed(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_as_json() {
        let r = SharedRequest {
            prompt: vec![1, 2, 3],
            max_tokens: 8,
            sampler: SamplerSettings {
                temp: 0.7,
                top_p: 0.9,
                ..Default::default()
            },
            processors: ProcessorSettings {
                logit_bias: vec![(3, -1.5)],
                repetition_penalty: Some(1.1),
                ..Default::default()
            },
            stop_strings: vec!["\n".into()],
            logprobs: true,
            top_logprobs: 2,
            seed: Some(7),
            timeout_ms: None,
        };
        for m in [Message::Run(Box::new(r)), Message::Stop, Message::Quit] {
            assert_eq!(Message::from_bytes(&m.to_bytes()).unwrap(), m);
        }
        assert!(Message::from_bytes(b"{").is_err());
    }
}
