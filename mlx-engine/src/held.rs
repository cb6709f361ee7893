//! The MLX caches a generation hands back, with the tokens they do not hold yet.
//!
//! A generation on the graph decoder runs tokens the MLX caches never see (the decoder keeps
//! its own cache). [`crate::generate::GenerateStep::into_cache`] runs them through the MLX
//! forward before it returns the caches, so that they hold what the MLX path's would (what a
//! prompt-cache file or [`crate::chat::ChatSession`]'s prefix reuse needs).
//! [`crate::generate::GenerateStep::into_held_cache`] leaves that to whoever needs it:
//! [`HeldCaches`] carries the caches and those tokens, and runs them only when the caches are
//! used ([`HeldCaches::sync`], [`HeldCaches::continue_with`]).
//!
//! What that saves: a trellis-coded model's prompt goes through the graph decoder (MLX's path
//! decodes each trellis linear on the host, one at a time), so after such a generation the MLX
//! caches hold nothing and every token is pending. Running them through the MLX forward costs
//! about what the MLX path's prompt would (issue #34). [`HeldCaches::continue_with`] instead
//! hands a continuation (`mlx chat`'s next turn) the pending tokens as the head of its prompt,
//! which then goes through the decoder too; a conversation that ends runs nothing. A decoder
//! kept in a conversation's slot ([`crate::graph::GraphKeep::for_conversation`]) holds those
//! tokens in its own cache already, so the next turn runs only the tokens after the ones it
//! holds (its new prompt, and the last reply's last token where a greedy run never stepped
//! it), not the whole conversation again. Where the
//! caches hold something (every other model on the graph decoder: its prompt ran on MLX's
//! path, only the generated tokens are pending; the CPU decoder and the MLX path: nothing is
//! pending), a continuation syncs first, as before.

use mlx_cache::Cache;
use mlx_models::LanguageModel;

use crate::{EngineError, Result};

/// MLX caches and the tokens, in order after what they hold, that they do not hold yet.
pub struct HeldCaches {
    caches: Vec<Box<dyn Cache>>,
    pending: Vec<i32>,
}

/// What a continuation of [`HeldCaches`] runs: the caches to continue and its prompt.
pub type Continuation = (Vec<Box<dyn Cache>>, Vec<u32>);

impl HeldCaches {
    /// `caches` with `pending` tokens not run through them yet.
    pub fn new(caches: Vec<Box<dyn Cache>>, pending: Vec<i32>) -> Self {
        Self { caches, pending }
    }

    /// Caches that hold every token.
    pub fn synced(caches: Vec<Box<dyn Cache>>) -> Self {
        Self::new(caches, Vec::new())
    }

    /// The tokens the caches do not hold yet.
    pub fn pending(&self) -> &[i32] {
        &self.pending
    }

    /// The positions the caches hold now (their largest offset; 0 without caches).
    pub fn cached(&self) -> usize {
        self.caches.iter().map(|c| c.offset()).max().unwrap_or(0)
    }

    /// Tokens held for a continuation: in the caches or pending.
    pub fn tokens(&self) -> usize {
        self.cached() + self.pending.len()
    }

    /// The caches with the pending tokens run through `model`'s MLX forward: they hold every
    /// token. Where that fails, the error is returned and the caches are lost (a forward that
    /// failed may have left some layers updated).
    pub fn sync(self, model: &dyn LanguageModel) -> Result<Vec<Box<dyn Cache>>> {
        let (caches, ran) = self.run_pending(model);
        ran.map(|()| caches)
    }

    /// [`Self::sync`], keeping the caches where the forward fails (they may then hold fewer
    /// tokens than were generated: [`crate::generate::GenerateStep::into_cache`]'s contract).
    pub fn sync_or_keep(self, model: &dyn LanguageModel) -> Vec<Box<dyn Cache>> {
        self.run_pending(model).0
    }

    /// The pending tokens through `model`'s MLX forward into the caches (nothing when none
    /// are pending): the caches and how the forward went.
    fn run_pending(self, model: &dyn LanguageModel) -> (Vec<Box<dyn Cache>>, Result<()>) {
        let Self {
            mut caches,
            pending,
        } = self;
        let ran = if pending.is_empty() {
            Ok(())
        } else {
            crate::generate::on_generation_stream(|| {
                crate::generate::forward_into_caches(
                    model,
                    &mut caches,
                    &pending,
                    crate::generate::DEFAULT_PREFILL_STEP_SIZE,
                )
            })
        };
        (caches, ran)
    }

    /// What continuing with `prompt` runs ([`Self::plan`] carried out): the caches and the
    /// prompt to pass to the next generation.
    pub fn continue_with(self, model: &dyn LanguageModel, prompt: &[u32]) -> Result<Continuation> {
        match self.plan() {
            Plan::AsIs => Ok((self.caches, prompt.to_vec())),
            Plan::Prepend => {
                let mut p = self
                    .pending
                    .iter()
                    .map(|&t| {
                        u32::try_from(t).map_err(|_| EngineError::Internal {
                            what: "held caches".into(),
                            problem: format!("a pending token id of {t}"),
                        })
                    })
                    .collect::<Result<Vec<u32>>>()?;
                p.extend_from_slice(prompt);
                Ok((self.caches, p))
            }
            Plan::SyncFirst => Ok((self.sync(model)?, prompt.to_vec())),
        }
    }

    /// How a continuation treats the pending tokens (see [`Plan`]).
    pub fn plan(&self) -> Plan {
        if self.pending.is_empty() {
            Plan::AsIs
        } else if self.cached() == 0 {
            Plan::Prepend
        } else {
            Plan::SyncFirst
        }
    }
}

/// How [`HeldCaches::continue_with`] treats the pending tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// None pending: the caches and the prompt as they are.
    AsIs,
    /// The caches hold nothing (a trellis prompt ran on the graph decoder): the pending tokens
    /// become the head of the next prompt, run as the next generation runs its prompt (through
    /// the decoder for a trellis model; a decoder kept in a conversation's slot, which holds
    /// them, runs only the tokens after those it holds: [`crate::graph::reusable`]), and the
    /// caches go on empty. No MLX forward runs here.
    Prepend,
    /// The caches hold a prefix (a prompt that ran on MLX's path): the pending tokens are run
    /// through the MLX forward first, as [`crate::generate::GenerateStep::into_cache`] does.
    SyncFirst,
}
