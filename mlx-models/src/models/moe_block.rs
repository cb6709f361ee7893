//! The mixture-of-experts block the ports share: the routers ([`Router`], DeepSeek's grouped
//! choice [`group_expert_select`]), the experts with their optional shared experts
//! ([`SparseMoe`], its extras [`BlockExtras`]), and a layer's feed-forward block, dense or
//! sparse ([`Ffn`]). Every MoE port routes through [`Router::select`]; `moe.rs` (the MoE
//! rows), lfm2, qwen3_next, jamba, granitemoehybrid, mimo_v2_flash, llama4, minimax_m3,
//! step3p5, deepseek, bailing_linear and longcat_flash use the whole block.

use mlx_core::prelude::*;

use crate::error::{ModelError, Result};
use crate::layers::{join, Linear, Mlp, MlpKind, MlpNames, SwitchActivation, SwitchGlu, Walk};
use crate::weights::Weights;

/// How a router turns gate logits into `k` experts and their weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Router {
    /// qwen3_moe / qwen3_next: `softmax`, `argpartition(gates, -k)[..., -k:]`, optional
    /// renormalization; qwen3_moe casts the weighted sum back to the experts' dtype.
    SoftmaxUpperPartition {
        norm_topk_prob: bool,
        cast_back: bool,
    },
    /// qwen2_moe / olmoe: `softmax`, `argpartition(-gates, k - 1)[..., :k]`, optional
    /// renormalization; olmoe flattens tokens to `(B * L, D)` first.
    SoftmaxLowerPartition { norm_topk_prob: bool, flatten: bool },
    /// mixtral: `argpartition(-gates, k - 1)[..., :k]` on the logits, softmax over the `k`.
    TopKThenSoftmax,
    /// gpt_oss (`mlx_topk`): `argpartition(gates, -k)[..., -k:]` on the logits, softmax over
    /// the `k`.
    UpperTopKThenSoftmax,
    /// granitemoe: [`Router::UpperTopKThenSoftmax`] with the softmax over the float32 top-k
    /// logits, the weighted sum cast back to the experts' dtype.
    UpperTopKThenSoftmaxF32,
    /// minimax: `sigmoid(gate(x.astype(float32)))`; the choice on the scores plus the
    /// correction bias (`argpartition(-scores, k - 1)[..., :k]`), the weights the uncorrected
    /// scores over their sum + 1e-20, cast to the input's dtype.
    SigmoidCorrected,
    /// ernie4_5_moe: softmax (or sigmoid) of the float32 logits, `argpartition(-gates, k -
    /// 1)[..., :k]`, over `max(sum, 1e-12)`, the weighted sum cast back to the experts' dtype.
    NormalizedTopK { sigmoid: bool },
    /// phimoe's `sparsemixer` (HF's inference path): `k` rounds, each taking the argmax of
    /// the still-unmasked logits, weighting it by a precise softmax over the logits within
    /// `2 * jitter_eps` (relative) of that maximum, then masking it with `-inf`.
    SparseMixer { jitter_eps: f64 },
    /// Klear: `sigmoid(gate(x).astype(float32))`; the choice on those plus the expert bias
    /// (`argpartition(-biased, k - 1)[..., :k]`), the weights the unbiased ones, optionally
    /// over their sum, cast to the input's dtype.
    SigmoidBiased { norm_topk_prob: bool },
    /// hunyuan: precise softmax, `argpartition(-gates, k - 1)[..., :k]`, the weighted sum
    /// with the weights in float32, cast back to the experts' dtype.
    SoftmaxLowerF32Weights,
    /// lfm2_moe: `sigmoid(gate(x))`; the choice `argpartition(scores, -k)[..., -k:]` on
    /// them (plus the float32 expert bias when `biased`), the weights the plain ones,
    /// optionally over their sum + 1e-6, times `routed_scaling_factor`, cast to the input's
    /// dtype.
    SigmoidUpper {
        norm_topk_prob: bool,
        routed_scaling_factor: f64,
        biased: bool,
    },
    /// exaone_moe's `group_expert_select` (an `mx.compile`d function there, compiled here
    /// too): sigmoid of the float32 logits plus the correction bias, `n_group` groups of
    /// which the `n_group - topk_group` weakest (by their top-2 sum) are zeroed,
    /// `argpartition(-scores, k - 1)[..., :k]`, the uncorrected scores of the chosen (over
    /// their sum + 1e-20 when `k > 1` and `norm_topk_prob`) times `routed_scaling_factor`;
    /// the weighted sum cast back to the experts' dtype.
    Grouped {
        n_group: i32,
        topk_group: i32,
        routed_scaling_factor: f64,
        norm_topk_prob: bool,
    },
    /// bailing_moe's `group_expert_select` (compiled too): [`Router::Grouped`] with a
    /// softmax (or sigmoid) score, an optional bias, the choice
    /// `argpartition(scores, -k)[..., -k:]`, and the weights cast to the logits' dtype.
    GroupedBailing {
        n_group: i32,
        topk_group: i32,
        routed_scaling_factor: f64,
        norm_topk_prob: bool,
        sigmoid: bool,
    },
    /// afmoe (plain ops, not compiled): sigmoid or softmax of the float32 logits, plus the
    /// expert bias for the choice, [`Router::Grouped`]'s groups, the lower choice, the
    /// unbiased scores over their sum (no epsilon) when `route_norm` and `k > 1`, times
    /// `route_scale`; the weighted sum cast back to the experts' dtype.
    GroupedPlain {
        n_group: i32,
        topk_group: i32,
        route_scale: f64,
        route_norm: bool,
        sigmoid: bool,
    },
    /// laguna: float32 logits (soft-capped when `softcap > 0`), sigmoid or
    /// `sqrt(softplus(.))` scores, the choice on scores plus the correction bias (lower
    /// top-k), the weights the chosen scores over their sum; the weighted sum cast back.
    Laguna { softcap: f64, sqrt_softplus: bool },
    /// llama4: the lower top-k of the logits, the chosen logits' float32 sigmoid cast to the
    /// input's dtype; the experts run on the input times that score and their output is
    /// squeezed, not summed (llama4 takes one expert per token).
    SigmoidScaledInput,
    /// minimax_m3 and step3p5's `moe_gate_select` (plain ops): sigmoid of the float32
    /// logits, the choice on them plus the correction bias (lower top-k), the chosen
    /// uncorrected scores over their sum + 1e-20 when `norm_topk_prob`, times
    /// `routed_scaling_factor`; cast to the input's dtype when `cast_weights` (minimax_m3),
    /// else the weighted sum cast back to the experts' dtype (step3p5).
    SigmoidCorrectedScaled {
        norm_topk_prob: bool,
        routed_scaling_factor: f64,
        cast_weights: bool,
    },
    /// deepseek / deepseek_v2's `MoEGate`: precise softmax, v2's `group_limited_greedy`
    /// (`(n_group, topk_group)`: groups ranked by their best score, the weakest zeroed), the
    /// lower choice, no renormalization, v2's routed scale.
    DeepseekSoftmax {
        groups: Option<(i32, i32)>,
        scale: Option<f64>,
    },
    /// deepseek_v3's family (deepseek_v3, kimi_k25, glm4_moe(_lite), dots1, mistral4, ...):
    /// the compiled `group_expert_select` with [`GroupSelect::deepseek`]'s constants, the
    /// correction bias an input when the block has one; the weighted sum cast back.
    /// kimi_linear, kimi_k3 and nemotron_h route with it too, with their own constants.
    DeepseekGroup(GroupSelect),
    /// dbrx: softmax of the float32 logits, the lower choice, the chosen over their L1 norm
    /// (`mx.linalg.norm(scores, ord=1)`: the sum of their absolute values), cast to the
    /// input's dtype. dbrx routes with it but runs its experts itself, token by token (see
    /// `dbrx.rs`), so no [`SparseMoe`] holds it.
    SoftmaxL1,
    /// bailing_moe_linear's `group_expert_select` and bailing_hybrid's `Gate` (plain ops):
    /// sigmoid or softmax of the float32 logits, plus the expert bias for the choice; the
    /// `n_group - topk_group` weakest groups (by their top-2 sum) zeroed when `n_group > 1`,
    /// or set to `-inf` when `hybrid`; the lower choice; the chosen unbiased scores over their
    /// sum (`sum + 1e-20` when `hybrid`) when `k > 1` and `norm_topk_prob`, times
    /// `routed_scaling_factor`, cast to the logits' dtype.
    BailingPlain {
        n_group: i32,
        topk_group: i32,
        routed_scaling_factor: f64,
        norm_topk_prob: bool,
        sigmoid: bool,
        hybrid: bool,
    },
    /// bailing_moe_v3's `BailingGate` on the float32 logits its port computes against the raw
    /// `weight`: sigmoid scores plus `expert_bias` for the choice, the weakest groups set to
    /// `-inf`, the lower choice, the chosen unbiased scores over their sum + 1e-20 whatever
    /// `k`, times `routed_scaling_factor`.
    BailingV3 {
        n_group: i32,
        topk_group: i32,
        routed_scaling_factor: f64,
    },
    /// deepseek_v41's `Router` on the float32 logits its port computes: the logits over
    /// `gate_temp`, scored by [`ScoreFunc`], plus the correction bias for the lower choice, the
    /// chosen unbiased scores over their sum + 1e-20 when `k > 1` and `norm_topk_prob`, times
    /// `route_scale` (scalars weak in the scores' dtype); not cast.
    DeepseekV4 {
        score: ScoreFunc,
        gate_temp: f64,
        norm_topk_prob: bool,
        route_scale: f64,
    },
    /// gemma4_text's `Router` (on its own scaled RMS norm of the input): the upper choice
    /// (`argpartition(gates, -k)[..., -k:]`) on the logits, a softmax over the chosen, times
    /// `per_expert_scale[inds]` (the block's array, passed as `select`'s `router_array`).
    UpperTopKThenSoftmaxScaled,
    /// longcat_flash's `LongcatFlashTopkRouter`: softmax of the logits plus the correction bias
    /// for the upper choice, the chosen unbiased scores over `sum + 1e-20` when
    /// `norm_topk_prob`, times `routed_scaling_factor`, cast to the input's dtype (the
    /// identity experts' indices are the port's).
    SoftmaxCorrectedUpper {
        norm_topk_prob: bool,
        routed_scaling_factor: f64,
    },
}

/// deepseek_v41's `scoring_func`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreFunc {
    Sigmoid,
    Softmax,
    /// `sqrt(softplus(logits))` (`sqrtsoftplus`).
    SqrtSoftplus,
}

/// The constant arguments of a compiled `group_expert_select`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupSelect {
    pub(crate) top_k: i32,
    pub(crate) n_group: i32,
    pub(crate) topk_group: i32,
    pub(crate) scaling_bits: u64,
    pub(crate) norm_topk_prob: bool,
    /// bailing_moe's variant (softmax or sigmoid, upper choice, weights cast back).
    pub(crate) bailing: bool,
    pub(crate) sigmoid: bool,
    pub(crate) has_bias: bool,
    /// kimi_linear's variant: the scores in the gates' own dtype (no float32 cast, a precise
    /// softmax), the bias and the zeroed groups in that dtype.
    pub(crate) kimi: bool,
    /// The weights cast back to the gates' dtype (bailing_moe, kimi_k3).
    pub(crate) cast_back: bool,
    /// The groups are masked: `n_group > 1` for most; DeepSeek's rows name their own rule
    /// ([`GroupSelect::deepseek`]).
    pub(crate) grouped: bool,
    /// The chosen scores are renormalized whatever `top_k` (mistral4's
    /// `mistral4_expert_select`); otherwise only when `top_k > 1`.
    pub(crate) norm_any_k: bool,
    /// The renormalizing denominator is `sum + 1e-20` (every row but deepseek_v3's, dots1's,
    /// kimi_k25's and their kin, which divide by the plain sum).
    pub(crate) eps: bool,
}

impl GroupSelect {
    /// deepseek_v3.py's `group_expert_select` (and glm4_moe_lite's with `+ 1e-20`, mistral4's
    /// `mistral4_expert_select` with softmax scores, no bias, renormalized whatever `top_k`):
    /// float32 gates, the groups masked when `grouped`, the lower choice, the weights not
    /// cast back.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn deepseek(
        top_k: i32,
        grouped: bool,
        n_group: i32,
        topk_group: i32,
        routed_scaling_factor: f64,
        norm_topk_prob: bool,
        denominator_eps: bool,
        softmax: bool,
        has_bias: bool,
    ) -> GroupSelect {
        GroupSelect {
            top_k,
            n_group,
            topk_group,
            scaling_bits: routed_scaling_factor.to_bits(),
            norm_topk_prob,
            bailing: false,
            sigmoid: !softmax,
            has_bias,
            kimi: false,
            cast_back: false,
            grouped,
            norm_any_k: softmax,
            eps: denominator_eps,
        }
    }
}

/// exaone_moe.py's `group_expert_select(gates, bias, top_k, ...)` as an `mx.compile`d
/// function (not shapeless): one compiled function per thread and per set of constants, as
/// `mx.compile` keys its cache on the non-array arguments.
fn group_expert_select(gates: &Array, bias: &Array, key: GroupSelect) -> Result<(Array, Array)> {
    use mlx_core::compile::{compile, Compiled};
    use std::cell::RefCell;
    use std::collections::HashMap;
    thread_local! {
        static FNS: RefCell<HashMap<GroupSelect, &'static Compiled<'static>>> =
            RefCell::new(HashMap::new());
    }
    let GroupSelect {
        top_k,
        n_group,
        topk_group,
        scaling_bits,
        norm_topk_prob,
        bailing,
        sigmoid,
        has_bias,
        kimi,
        cast_back,
        grouped,
        norm_any_k,
        eps,
    } = key;
    let routed_scaling_factor = f64::from_bits(scaling_bits);
    let f = FNS.with(|m| -> Result<&'static Compiled<'static>> {
        if let Some(f) = m.borrow().get(&key) {
            return Ok(*f);
        }
        let body = move |xs: &[Array]| -> mlx_core::Result<Vec<Array>> {
            let g = if kimi {
                xs[0].clone()
            } else {
                xs[0].astype(Dtype::Float32)?
            };
            let scores = if sigmoid {
                ops::sigmoid(&g, None)?
            } else {
                ops::softmax(&g, &[-1], kimi, None)?
            };
            let orig = scores.clone();
            let mut scores = if has_bias && kimi {
                (&scores + &xs[1].astype(scores.dtype())?)?
            } else if has_bias {
                (&scores + &xs[1])?
            } else {
                scores
            };
            let zero_dtype = if kimi { scores.dtype() } else { Dtype::Float32 };
            if grouped {
                let grouped = ops::unflatten(&scores, -1, &[n_group, -1], None)?;
                let group_scores = ops::sum(&ops::topk(&grouped, 2, -1, None)?, &[-1], true, None)?;
                let k = n_group - topk_group;
                let idx = ops::slice_axis(
                    &ops::argpartition(&group_scores, k - 1, -2, None)?,
                    -2,
                    0,
                    k,
                    None,
                )?;
                let zeroed = ops::put_along_axis(
                    &grouped,
                    &ops::stop_gradient(&idx, None)?,
                    &Array::from_f32(0.0, zero_dtype)?,
                    -2,
                    None,
                )?;
                scores = ops::flatten(&zeroed, -2, -1, None)?;
            }
            let inds = if bailing {
                let n = scores.shape().last().copied().unwrap_or(0);
                ops::slice_axis(
                    &ops::argpartition(&scores, -top_k, -1, None)?,
                    -1,
                    n - top_k,
                    n,
                    None,
                )?
            } else {
                let neg = ops::negative(&scores, None)?;
                ops::slice_axis(
                    &ops::argpartition(&neg, top_k - 1, -1, None)?,
                    -1,
                    0,
                    top_k,
                    None,
                )?
            };
            let inds = ops::stop_gradient(&inds, None)?;
            let mut scores = ops::take_along_axis(&orig, &inds, -1, None)?;
            if (top_k > 1 || norm_any_k) && norm_topk_prob {
                let mut total = ops::sum(&scores, &[-1], true, None)?;
                if eps {
                    total = (&total + 1e-20f32)?;
                }
                scores = (&scores / &total)?;
            }
            let mut scores = (&scores * routed_scaling_factor as f32)?;
            if cast_back {
                scores = scores.astype(xs[0].dtype())?;
            }
            Ok(vec![inds, scores])
        };
        let f: &'static Compiled<'static> = Box::leak(Box::new(compile(body, false)?));
        m.borrow_mut().insert(key, f);
        Ok(f)
    })?;
    let mut out = f.call(&[gates.clone(), bias.clone()])?.into_iter();
    match (out.next(), out.next()) {
        (Some(inds), Some(scores)) => Ok((inds, scores)),
        _ => Err(ModelError::Internal {
            what: "compiled group_expert_select".into(),
            problem: "returned too few outputs".into(),
        }),
    }
}

/// What a [`SparseMoe`] block may have beyond [`SparseMoeParams`].
#[derive(Clone, Debug, Default)]
pub struct BlockExtras {
    /// minimax (`e_score_correction_bias`), Klear (`expert_bias`): a learned bias of
    /// `num_experts`, under this name, added to the scores before the top-k choice.
    pub correction_bias: Option<&'static str>,
    /// ernie4_5_moe, Klear: an ungated `shared_experts` SwiGLU MLP of this width (with biases
    /// when the flag is set), added to the experts' output.
    pub plain_shared: Option<(i32, bool)>,
    /// The shared MLP's module name (`shared_experts` when `None`; hunyuan `shared_mlp`).
    pub plain_shared_name: Option<&'static str>,
    /// laguna: the experts' (cast) output times this before the shared expert is added.
    pub output_scale: Option<f32>,
    /// Klear: `coefficient`, a biased linear to 2 whose precise softmax mixes the experts'
    /// output (first) and the shared experts' (second) instead of adding them.
    pub coefficient: bool,
}

/// What a [`SparseMoe`] block is made of.
#[derive(Clone, Debug)]
pub struct SparseMoeParams {
    pub hidden_size: i32,
    pub num_experts: i32,
    pub top_k: i32,
    pub moe_intermediate_size: i32,
    pub expert_bias: bool,
    pub router: Router,
    pub shared_expert_intermediate_size: Option<i32>,
    /// Module names of the router and the experts (`gate`/`switch_mlp`; gpt_oss
    /// `router`/`experts`).
    pub names: [&'static str; 2],
    pub router_bias: bool,
    pub activation: SwitchActivation,
}

/// The expert block: router, experts, optional gated shared expert.
#[derive(Clone)]
pub struct SparseMoe {
    pub(crate) top_k: i32,
    pub(crate) router: Router,
    pub(crate) gate: Linear,
    pub(crate) switch_mlp: SwitchGlu,
    pub(crate) shared_expert: Option<(Mlp, Linear)>,
    /// Module names of the router and the experts ([`SparseMoeParams::names`]).
    pub(crate) names: [&'static str; 2],
    /// mlx-lm's `sharding_group` (qwen3_moe's `shard()`): the output summed over the group.
    pub(crate) sharded: bool,
    /// minimax's `e_score_correction_bias`, Klear's `expert_bias`, under its name
    /// ([`BlockExtras::correction_bias`]).
    pub(crate) correction_bias: Option<(&'static str, Array)>,
    /// The ungated `shared_experts` ([`BlockExtras::plain_shared`]).
    pub(crate) plain_shared: Option<Mlp>,
    /// Its module name ([`BlockExtras::plain_shared_name`]).
    pub(crate) plain_shared_name: &'static str,
    /// Klear's `coefficient` ([`BlockExtras::coefficient`]).
    pub(crate) coefficient: Option<Linear>,
    /// laguna's `routed_scaling_factor` ([`BlockExtras::output_scale`]).
    pub(crate) output_scale: Option<f32>,
    /// The tokens flattened to `(B * L, D)` before the router and the output reshaped back
    /// (minimax_m3; olmoe through its router's `flatten`).
    pub(crate) flatten: bool,
    /// longcat_flash's identity ("zero") experts ([`SparseMoe::with_identity_experts`]): the
    /// router's indices from this one on run no expert; their weights are zeroed for the
    /// experts and their sum times the input is added after the (sharded) experts' sum.
    pub(crate) identity_from: Option<i32>,
}

/// What a port that loads its block's parts itself hands [`SparseMoe::from_parts`]: ports
/// whose mlx-lm module declares its parts in another order than [`SparseMoe::load_with`]'s
/// load them in their own order (the order `mlx convert` records the quantizable modules
/// in), then build the block from them.
pub(crate) struct MoeParts {
    pub(crate) top_k: i32,
    pub(crate) router: Router,
    /// The router's projection (a plain weight is a bias-free [`Linear::Dense`]).
    pub(crate) gate: Linear,
    pub(crate) experts: SwitchGlu,
    /// The router's and the experts' module names.
    pub(crate) names: [&'static str; 2],
    /// A correction bias for the choice, under its name ([`BlockExtras::correction_bias`]).
    pub(crate) correction_bias: Option<(&'static str, Array)>,
    /// Un-gated shared experts added to the experts' output, under their name.
    pub(crate) plain_shared: Option<(&'static str, Mlp)>,
    pub(crate) flatten: bool,
}

impl SparseMoe {
    /// Experts a token.
    pub fn top_k(&self) -> i32 {
        self.top_k
    }

    /// How the router chooses.
    pub fn router(&self) -> Router {
        self.router
    }

    /// The router's linear (the gate logits).
    pub fn gate(&self) -> &Linear {
        &self.gate
    }

    /// The experts.
    pub fn experts(&self) -> &SwitchGlu {
        &self.switch_mlp
    }

    /// What the block has beyond the router and the experts (for messages): a shared
    /// expert, plain shared experts, a correction bias, a coefficient, an output scale, a
    /// sharded sum.
    pub fn extras_present(&self) -> Vec<&'static str> {
        [
            (self.shared_expert.is_some(), "a gated shared expert"),
            (self.plain_shared.is_some(), "shared experts"),
            (self.correction_bias.is_some(), "a router correction bias"),
            (self.coefficient.is_some(), "a shared-expert coefficient"),
            (self.output_scale.is_some(), "an output scale"),
            (self.sharded, "tensor-parallel shards"),
            (self.identity_from.is_some(), "identity experts"),
        ]
        .into_iter()
        .filter_map(|(p, w)| p.then_some(w))
        .collect()
    }

    /// The block at `path` (`gate`, `switch_mlp`, optional `shared_expert` and
    /// `shared_expert_gate`).
    pub fn load_parts(w: &mut Weights, path: &str, s: &SparseMoeParams) -> Result<SparseMoe> {
        SparseMoe::load_with(w, path, &BlockExtras::default(), s)
    }

    /// [`SparseMoe::load_parts`] with the block's extras (a correction bias, plain shared
    /// experts).
    pub fn load_with(
        w: &mut Weights,
        path: &str,
        extras: &BlockExtras,
        s: &SparseMoeParams,
    ) -> Result<SparseMoe> {
        let p = |n: &str| format!("{path}.{n}");
        let correction_bias = match extras.correction_bias {
            Some(name) => Some((name, w.take(&p(name), &[s.num_experts])?)),
            None => None,
        };
        let coefficient = if extras.coefficient {
            Some(Linear::load(w, &p("coefficient"), s.hidden_size, 2, true)?)
        } else {
            None
        };
        let plain_shared = match extras.plain_shared {
            Some((h, bias)) => Some(Mlp::load(
                w,
                &p(extras.plain_shared_name.unwrap_or("shared_experts")),
                &crate::layers::MlpNames::LLAMA,
                s.hidden_size,
                h,
                bias,
                bias,
                MlpKind::SwiGlu,
            )?),
            None => None,
        };
        let shared_expert = match s.shared_expert_intermediate_size {
            Some(h) => Some((
                Mlp::load(
                    w,
                    &p("shared_expert"),
                    &crate::layers::MlpNames::LLAMA,
                    s.hidden_size,
                    h,
                    false,
                    false,
                    MlpKind::SwiGlu,
                )?,
                Linear::load(w, &p("shared_expert_gate"), s.hidden_size, 1, false)?,
            )),
            None => None,
        };
        Ok(SparseMoe {
            top_k: s.top_k,
            router: s.router,
            gate: Linear::load(
                w,
                &p(s.names[0]),
                s.hidden_size,
                s.num_experts,
                s.router_bias,
            )?,
            switch_mlp: SwitchGlu::load(
                w,
                &p(s.names[1]),
                s.hidden_size,
                s.moe_intermediate_size,
                s.num_experts,
                s.expert_bias,
                s.activation,
            )?,
            shared_expert,
            names: s.names,
            sharded: false,
            correction_bias,
            plain_shared,
            plain_shared_name: extras.plain_shared_name.unwrap_or("shared_experts"),
            coefficient,
            output_scale: extras.output_scale,
            flatten: false,
            identity_from: None,
        })
    }

    /// The block from parts its port loaded ([`MoeParts`]): no gated shared expert, no
    /// coefficient, no output scale.
    pub(crate) fn from_parts(p: MoeParts) -> SparseMoe {
        let (plain_shared_name, plain_shared) = match p.plain_shared {
            Some((name, mlp)) => (name, Some(mlp)),
            None => ("shared_experts", None),
        };
        SparseMoe {
            top_k: p.top_k,
            router: p.router,
            gate: p.gate,
            switch_mlp: p.experts,
            shared_expert: None,
            names: p.names,
            sharded: false,
            correction_bias: p.correction_bias,
            plain_shared,
            plain_shared_name,
            coefficient: None,
            output_scale: None,
            flatten: p.flatten,
            identity_from: None,
        }
    }

    /// longcat_flash's `LongcatFlashMoE`: the router's indices from `n_routed` on are
    /// identity experts (`zero_expert_type` `identity`). They are sent to expert 0 with a zero
    /// weight, and `x` times their summed weight is added after the experts' sum (after the
    /// sharded sum, so it is not summed over the ranks).
    pub(crate) fn with_identity_experts(mut self, n_routed: i32) -> SparseMoe {
        self.identity_from = Some(n_routed);
        self
    }

    /// Walks the router, the experts' switch linears (then the router's correction bias),
    /// the shared expert and its gate, the plain shared experts and the coefficient, in the
    /// order mlx-lm's blocks declare them (gpt_oss: experts, router; the others: gate,
    /// switch_mlp, shared_expert, shared_expert_gate).
    pub fn walk<'a>(&'a mut self, path: &str, w: &mut Walk<'a>) {
        let SparseMoe {
            gate,
            switch_mlp,
            shared_expert,
            names: [router, experts],
            correction_bias,
            plain_shared,
            plain_shared_name,
            coefficient,
            ..
        } = self;
        let p = |n: &str| join(path, n);
        // gpt_oss's `MLPBlock` declares `experts` before `router`; the others' blocks
        // declare `gate` first.
        let mut gate = Some(gate);
        if *router != "router" {
            w.linear_opt(&p(router), gate.take());
        }
        w.module(&p(experts), switch_mlp);
        if let Some((name, b)) = correction_bias {
            w.array(path, name, b);
        }
        w.linear_opt(&p(router), gate.take());
        if let Some((mlp, shared_gate)) = shared_expert {
            mlp.walk(&p("shared_expert"), &MlpNames::LLAMA, w);
            w.linear(&p("shared_expert_gate"), shared_gate);
        }
        if let Some(mlp) = plain_shared {
            mlp.walk(&p(plain_shared_name), &MlpNames::LLAMA, w);
        }
        if let Some(c) = coefficient {
            w.linear(&p("coefficient"), c);
        }
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let k = self.top_k;
        let shape = x.shape();
        let d = shape.last().copied().unwrap_or(0);
        let flatten = self.flatten
            || matches!(
                self.router,
                Router::SoftmaxLowerPartition { flatten: true, .. }
            );
        let x_in = if flatten {
            ops::reshape(x, &[-1, d], None)?
        } else {
            x.clone()
        };
        let last = |a: &Array, from: i32, to: i32| -> Result<Array> {
            Ok(ops::slice_axis(a, -1, from, to, None)?)
        };
        let gates = if self.router == Router::SigmoidCorrected {
            self.gate.forward(&x_in.astype(Dtype::Float32)?)?
        } else {
            self.gate.forward(&x_in)?
        };
        let bias = self.correction_bias.as_ref().map(|(_, b)| b);
        let (inds, scores, cast_back) = self.router.select(&gates, k, bias, &x_in)?;
        // longcat_flash: `mask = inds >= n_routed`, those indices sent to expert 0 with a zero
        // weight; the routed weights kept for the identity share.
        let (inds, scores, identity) = match self.identity_from {
            Some(n_routed) => {
                let mask = ops::greater_equal(
                    &inds,
                    &Scalar::Int(i64::from(n_routed)).to_array_like(inds.dtype())?,
                    None,
                )?;
                let zero_i = Scalar::Int(0).to_array_like(inds.dtype())?;
                let inds = ops::where_(&mask, &zero_i, &inds, None)?;
                let zero_w = Scalar::Float(0.0).to_array_like(scores.dtype())?;
                let regular = ops::where_(&mask, &zero_w, &scores, None)?;
                (inds, regular, Some((mask, scores, zero_w)))
            }
            None => (inds, scores, None),
        };
        let mut out = if self.router == Router::SigmoidScaledInput {
            // llama4: `experts(x * scores, indices).squeeze(2)`.
            let y = self.switch_mlp.forward(&(&x_in * &scores)?, &inds)?;
            ops::squeeze(&y, &[-2], None)?
        } else {
            let y = self.switch_mlp.forward(&x_in, &inds)?;
            let weighted = (&y * &ops::expand_dims(&scores, &[-1], None)?)?;
            let out = ops::sum(&weighted, &[-2], false, None)?;
            if cast_back {
                out.astype(y.dtype())?
            } else {
                out
            }
        };
        if let Some(scale) = self.output_scale {
            out = (&out * scale)?;
        }
        // The shared experts read the router's input (the flattened tokens when flattened).
        let x = &x_in;
        if let Some((mlp, gate)) = &self.shared_expert {
            let shared = mlp.forward(x)?;
            let shared = (&ops::sigmoid(&gate.forward(x)?, None)? * &shared)?;
            out = (&out + &shared)?;
        }
        match (&self.plain_shared, &self.coefficient) {
            (Some(mlp), Some(c)) => {
                let coef = ops::softmax(&c.forward(x)?, &[-1], true, None)?;
                let shared = mlp.forward(x)?;
                out = (&(&out * &last(&coef, 0, 1)?)? + &(&shared * &last(&coef, 1, 2)?)?)?;
            }
            (Some(mlp), None) => out = (&out + &mlp.forward(x)?)?,
            _ => {}
        }
        if flatten {
            out = ops::reshape(&out, &shape, None)?;
        }
        if self.sharded {
            out = mlx_core::distributed::all_sum(&out, None, None)?;
        }
        if let Some((mask, weights, zero_w)) = identity {
            let share = ops::sum(
                &ops::where_(&mask, &weights, &zero_w, None)?,
                &[-1],
                true,
                None,
            )?;
            out = (&out + &(&x_in * &share)?)?;
        }
        Ok(out)
    }
}

impl Router {
    /// The experts each token goes to and their weights, from the router's logits `gates`:
    /// `(inds, scores, cast_back)`, `cast_back` when the weighted sum is cast back to the
    /// experts' dtype. `correction_bias` is the block's ([`BlockExtras::correction_bias`]),
    /// or the router's one learned per-expert array of a port that routes with `select`
    /// itself (gemma4_text's `per_expert_scale`); `x_in` the router's input (its dtype and
    /// shape).
    pub(crate) fn select(
        self,
        gates: &Array,
        k: i32,
        correction_bias: Option<&Array>,
        x_in: &Array,
    ) -> Result<(Array, Array, bool)> {
        let gates = gates.clone();
        let flatten = matches!(self, Router::SoftmaxLowerPartition { flatten: true, .. });
        let last = |a: &Array, from: i32, to: i32| -> Result<Array> {
            Ok(ops::slice_axis(a, -1, from, to, None)?)
        };
        Ok(match self {
            Router::SoftmaxUpperPartition {
                norm_topk_prob,
                cast_back,
            } => {
                let gates = ops::softmax(&gates, &[-1], true, None)?;
                let n = gates.shape().last().copied().unwrap_or(0);
                let inds = last(&ops::argpartition(&gates, -k, -1, None)?, n - k, n)?;
                let inds = ops::stop_gradient(&inds, None)?;
                let mut scores = ops::take_along_axis(&gates, &inds, -1, None)?;
                if norm_topk_prob {
                    scores = (&scores / &ops::sum(&scores, &[-1], true, None)?)?;
                }
                (inds, scores, cast_back)
            }
            Router::SoftmaxLowerPartition { norm_topk_prob, .. } => {
                let axis = if flatten { 1 } else { -1 };
                let gates = ops::softmax(&gates, &[axis], true, None)?;
                let inds = lower_top_k(&gates, k)?;
                let mut scores = ops::take_along_axis(&gates, &inds, -1, None)?;
                if norm_topk_prob {
                    scores = (&scores / &ops::sum(&scores, &[-1], true, None)?)?;
                }
                (inds, scores, false)
            }
            Router::UpperTopKThenSoftmax => {
                let n = gates.shape().last().copied().unwrap_or(0);
                let inds = last(&ops::argpartition(&gates, -k, -1, None)?, n - k, n)?;
                let inds = ops::stop_gradient(&inds, None)?;
                let values = ops::take_along_axis(&gates, &inds, -1, None)?;
                (inds, ops::softmax(&values, &[-1], true, None)?, false)
            }
            Router::TopKThenSoftmax => {
                let inds = lower_top_k(&gates, k)?;
                let scores = ops::take_along_axis(&gates, &inds, -1, None)?;
                let scores = ops::softmax(&scores, &[-1], true, None)?;
                (inds, scores, false)
            }
            Router::UpperTopKThenSoftmaxF32 => {
                let n = gates.shape().last().copied().unwrap_or(0);
                let inds = last(&ops::argpartition(&gates, -k, -1, None)?, n - k, n)?;
                let inds = ops::stop_gradient(&inds, None)?;
                let values = ops::take_along_axis(&gates, &inds, -1, None)?;
                let scores = ops::softmax(&values.astype(Dtype::Float32)?, &[-1], false, None)?;
                (inds, scores, true)
            }
            Router::SigmoidCorrected => {
                let orig = ops::sigmoid(&gates, None)?;
                let chosen = match correction_bias {
                    Some(b) => (&orig + b)?,
                    None => orig.clone(),
                };
                let inds = lower_top_k(&chosen, k)?;
                let scores = ops::take_along_axis(&orig, &inds, -1, None)?;
                let total = (&ops::sum(&scores, &[-1], true, None)? + 1e-20f32)?;
                let scores = (&scores / &total)?.astype(x_in.dtype())?;
                (inds, scores, false)
            }
            Router::SigmoidBiased { norm_topk_prob } => {
                let weights = ops::sigmoid(&gates.astype(Dtype::Float32)?, None)?;
                let biased = match correction_bias {
                    Some(b) => (&weights + &ops::reshape(b, &[1, 1, -1], None)?)?,
                    None => weights.clone(),
                };
                let inds = lower_top_k(&biased, k)?;
                let mut scores = ops::take_along_axis(&weights, &inds, -1, None)?;
                if norm_topk_prob {
                    scores = (&scores / &ops::sum(&scores, &[-1], true, None)?)?;
                }
                (inds, scores.astype(x_in.dtype())?, false)
            }
            Router::SigmoidUpper {
                norm_topk_prob,
                routed_scaling_factor,
                biased,
            } => {
                let weights = ops::sigmoid(&gates, None)?;
                let choice = match (correction_bias, biased) {
                    (Some(b), true) => (&weights.astype(Dtype::Float32)? + b)?,
                    _ => weights.clone(),
                };
                let n = choice.shape().last().copied().unwrap_or(0);
                let inds = last(&ops::argpartition(&choice, -k, -1, None)?, n - k, n)?;
                let inds = ops::stop_gradient(&inds, None)?;
                let mut scores = ops::take_along_axis(&weights, &inds, -1, None)?;
                if norm_topk_prob {
                    let total = (&ops::sum(&scores, &[-1], true, None)? + 1e-6f32)?;
                    scores = (&scores / &total)?;
                }
                let scores = (&scores * routed_scaling_factor as f32)?;
                (inds, scores.astype(x_in.dtype())?, false)
            }
            Router::Grouped {
                n_group,
                topk_group,
                routed_scaling_factor,
                norm_topk_prob,
            } => {
                let bias = match correction_bias {
                    Some(b) => b.clone(),
                    None => Array::from_f32(0.0, Dtype::Float32)?,
                };
                let (inds, scores) = group_expert_select(
                    &gates,
                    &bias,
                    GroupSelect {
                        top_k: k,
                        n_group,
                        topk_group,
                        scaling_bits: routed_scaling_factor.to_bits(),
                        norm_topk_prob,
                        bailing: false,
                        sigmoid: true,
                        has_bias: true,
                        kimi: false,
                        cast_back: false,
                        grouped: n_group > 1,
                        norm_any_k: false,
                        eps: true,
                    },
                )?;
                (inds, scores, true)
            }
            Router::GroupedBailing {
                n_group,
                topk_group,
                routed_scaling_factor,
                norm_topk_prob,
                sigmoid,
            } => {
                let (bias, has_bias) = match correction_bias {
                    Some(b) => (b.clone(), true),
                    None => (Array::from_f32(0.0, Dtype::Float32)?, false),
                };
                let (inds, scores) = group_expert_select(
                    &gates,
                    &bias,
                    GroupSelect {
                        top_k: k,
                        n_group,
                        topk_group,
                        scaling_bits: routed_scaling_factor.to_bits(),
                        norm_topk_prob,
                        bailing: true,
                        sigmoid,
                        has_bias,
                        kimi: false,
                        cast_back: true,
                        grouped: n_group > 1,
                        norm_any_k: false,
                        eps: true,
                    },
                )?;
                (inds, scores, true)
            }
            Router::GroupedPlain {
                n_group,
                topk_group,
                route_scale,
                route_norm,
                sigmoid,
            } => {
                let g = gates.astype(Dtype::Float32)?;
                let scores = if sigmoid {
                    ops::sigmoid(&g, None)?
                } else {
                    ops::softmax(&g, &[-1], false, None)?
                };
                let mut selection = match correction_bias {
                    Some(b) => (&scores + b)?,
                    None => scores.clone(),
                };
                if n_group > 1 {
                    let zero = Array::from_f32(0.0, Dtype::Float32)?;
                    selection = drop_groups(&selection, n_group, n_group - topk_group, &zero)?;
                }
                let inds = lower_top_k(&selection, k)?;
                let mut chosen = ops::take_along_axis(&scores, &inds, -1, None)?;
                if route_norm && k > 1 {
                    chosen = (&chosen / &ops::sum(&chosen, &[-1], true, None)?)?;
                }
                (inds, (&chosen * route_scale as f32)?, true)
            }
            Router::Laguna {
                softcap,
                sqrt_softplus,
            } => {
                let mut logits = gates.astype(Dtype::Float32)?;
                if softcap > 0.0 {
                    logits = crate::layers::softcap(&logits, softcap as f32)?;
                }
                let scores = if sqrt_softplus {
                    let zero = Scalar::Int(0).to_array_like(logits.dtype())?;
                    ops::sqrt(&ops::logaddexp(&logits, &zero, None)?, None)?
                } else {
                    ops::sigmoid(&logits, None)?
                };
                let selection = match correction_bias {
                    Some(b) => (&scores + b)?,
                    None => scores.clone(),
                };
                let inds = lower_top_k(&selection, k)?;
                let w = ops::take_along_axis(&scores, &inds, -1, None)?;
                let w = (&w / &ops::sum(&w, &[-1], true, None)?)?;
                (inds, w, true)
            }
            Router::SoftmaxLowerF32Weights => {
                let gates = ops::softmax(&gates, &[-1], true, None)?;
                let inds = lower_top_k(&gates, k)?;
                let scores = ops::take_along_axis(&gates, &inds, -1, None)?;
                (inds, scores.astype(Dtype::Float32)?, true)
            }
            Router::SparseMixer { jitter_eps } => {
                let (inds, scores) = sparsemixer(&gates, k, jitter_eps)?;
                (inds, scores, false)
            }
            Router::SigmoidScaledInput => {
                let inds = lower_top_k(&gates, k)?;
                let scores = ops::take_along_axis(&gates, &inds, -1, None)?;
                let scores =
                    ops::sigmoid(&scores.astype(Dtype::Float32)?, None)?.astype(x_in.dtype())?;
                (inds, scores, false)
            }
            Router::SigmoidCorrectedScaled {
                norm_topk_prob,
                routed_scaling_factor,
                cast_weights,
            } => {
                let scores = ops::sigmoid(&gates.astype(Dtype::Float32)?, None)?;
                let chosen = match correction_bias {
                    Some(b) => (&scores + b)?,
                    None => scores.clone(),
                };
                let inds = lower_top_k(&chosen, k)?;
                let mut w = ops::take_along_axis(&scores, &inds, -1, None)?;
                if norm_topk_prob {
                    w = (&w / &(&ops::sum(&w, &[-1], true, None)? + 1e-20f32)?)?;
                }
                let w = (&w * routed_scaling_factor as f32)?;
                if cast_weights {
                    (inds, w.astype(x_in.dtype())?, false)
                } else {
                    (inds, w, true)
                }
            }
            Router::DeepseekSoftmax { groups, scale } => {
                let mut scores = ops::softmax(&gates, &[-1], true, None)?;
                if let Some((n_group, topk_group)) = groups {
                    let sh = x_in.shape();
                    let (bsz, seq) = (sh[0], sh[1]);
                    scores = ops::reshape(&scores, &[bsz, seq, n_group, -1], None)?;
                    let group_scores = ops::max(&scores, &[-1], true, None)?;
                    let gk = n_group - topk_group;
                    let idx = ops::argpartition(&group_scores, gk - 1, -2, None)?;
                    let group_idx =
                        ops::stop_gradient(&ops::slice_axis(&idx, -2, 0, gk, None)?, None)?;
                    let zero = Array::from_f32(0.0, scores.dtype())?;
                    scores = ops::put_along_axis(&scores, &group_idx, &zero, -2, None)?;
                    scores = ops::reshape(&scores, &[bsz, seq, -1], None)?;
                }
                let inds = lower_top_k(&scores, k)?;
                let mut scores = ops::take_along_axis(&scores, &inds, -1, None)?;
                if let Some(f) = scale {
                    scores = (&scores * f as f32)?;
                }
                (inds, scores, false)
            }
            Router::DeepseekGroup(select) => {
                let bias = match correction_bias {
                    Some(b) => b.clone(),
                    None if select.sigmoid => {
                        return Err(ModelError::Unsupported {
                            what: "group routing".into(),
                            problem: "without e_score_correction_bias".into(),
                        })
                    }
                    None => Array::from_f32(0.0, Dtype::Float32)?,
                };
                let (inds, scores) = group_expert_select(&gates, &bias, select)?;
                (inds, scores, true)
            }
            Router::SoftmaxL1 => {
                let gates = ops::softmax(&gates.astype(Dtype::Float32)?, &[-1], false, None)?;
                let inds = lower_top_k(&gates, k)?;
                let scores = ops::take_along_axis(&gates, &inds, -1, None)?;
                let l1 = ops::sum(&ops::abs(&scores, None)?, &[-1], true, None)?;
                (inds, (&scores / &l1)?.astype(x_in.dtype())?, false)
            }
            Router::BailingPlain {
                n_group,
                topk_group,
                routed_scaling_factor,
                norm_topk_prob,
                sigmoid,
                hybrid,
            } => {
                let in_type = gates.dtype();
                let g = gates.astype(Dtype::Float32)?;
                let scores = if sigmoid {
                    ops::sigmoid(&g, None)?
                } else {
                    ops::softmax(&g, &[-1], false, None)?
                };
                let mut sel = match correction_bias {
                    Some(b) => (&scores + b)?,
                    None => scores.clone(),
                };
                let n_drop = n_group - topk_group;
                if hybrid && n_drop > 0 {
                    let fill = Array::from_f32(f32::NEG_INFINITY, sel.dtype())?;
                    sel = drop_groups(&sel, n_group, n_drop, &fill)?;
                } else if !hybrid && n_group > 1 {
                    let zero = Array::from_f32(0.0, Dtype::Float32)?;
                    sel = drop_groups(&sel, n_group, n_drop, &zero)?;
                }
                let inds = lower_top_k(&sel, k)?;
                let mut w = ops::take_along_axis(&scores, &inds, -1, None)?;
                if k > 1 && norm_topk_prob {
                    let mut total = ops::sum(&w, &[-1], true, None)?;
                    if hybrid {
                        total = (&total + 1e-20f32)?;
                    }
                    w = (&w / &total)?;
                }
                let w = (&w * routed_scaling_factor as f32)?;
                (inds, w.astype(in_type)?, false)
            }
            Router::BailingV3 {
                n_group,
                topk_group,
                routed_scaling_factor,
            } => {
                let scores = ops::sigmoid(&gates.astype(Dtype::Float32)?, None)?;
                let routing = match correction_bias {
                    Some(b) => (&scores + b)?,
                    None => scores.clone(),
                };
                let fill = Array::from_f32(f32::NEG_INFINITY, Dtype::Float32)?;
                let routing = drop_groups(&routing, n_group, n_group - topk_group, &fill)?;
                let inds = lower_top_k(&routing, k)?;
                let selected = ops::take_along_axis(&scores, &inds, -1, None)?;
                let total = (&ops::sum(&selected, &[-1], true, None)? + 1e-20f32)?;
                let selected = (&selected / &total)?;
                (inds, (&selected * routed_scaling_factor as f32)?, false)
            }
            Router::DeepseekV4 {
                score,
                gate_temp,
                norm_topk_prob,
                route_scale,
            } => {
                let weak = |v: f64, like: &Array| Scalar::from(v).to_array_like(like.dtype());
                let logits = ops::divide(&gates, &weak(gate_temp, &gates)?, None)?;
                let scores = match score {
                    ScoreFunc::Sigmoid => ops::sigmoid(&logits, None)?,
                    ScoreFunc::Softmax => ops::softmax(&logits, &[-1], false, None)?,
                    ScoreFunc::SqrtSoftplus => {
                        ops::sqrt(&crate::layers::ssm::softplus(&logits)?, None)?
                    }
                };
                let biased = match correction_bias {
                    Some(b) => ops::add(&scores, b, None)?,
                    None => scores.clone(),
                };
                let chosen = ops::argpartition(&ops::negative(&biased, None)?, k - 1, -1, None)?;
                let chosen = ops::slice_axis(&chosen, -1, 0, k, None)?;
                let mut weights = ops::take_along_axis(&scores, &chosen, -1, None)?;
                if norm_topk_prob && k > 1 {
                    let s = ops::sum(&weights, &[-1], true, None)?;
                    weights = ops::divide(&weights, &ops::add(&s, &weak(1e-20, &s)?, None)?, None)?;
                }
                let weights = ops::multiply(&weights, &weak(route_scale, &weights)?, None)?;
                (chosen, weights, false)
            }
            Router::UpperTopKThenSoftmaxScaled => {
                let n = gates.shape().last().copied().unwrap_or(0);
                let inds = last(&ops::argpartition(&gates, -k, -1, None)?, n - k, n)?;
                let inds = ops::stop_gradient(&inds, None)?;
                let weights = ops::take_along_axis(&gates, &inds, -1, None)?;
                let weights = ops::softmax(&weights, &[-1], false, None)?;
                let weights = match correction_bias {
                    Some(scale) => (&weights * &ops::take(scale, &inds, 0, None)?)?,
                    None => weights,
                };
                (inds, weights, false)
            }
            Router::SoftmaxCorrectedUpper {
                norm_topk_prob,
                routed_scaling_factor,
            } => {
                let scores = ops::softmax(&gates, &[-1], false, None)?;
                let corrected = match correction_bias {
                    Some(b) => (&scores + b)?,
                    None => scores.clone(),
                };
                let n = corrected.shape().last().copied().unwrap_or(0);
                let inds = last(&ops::argpartition(&corrected, -k, -1, None)?, n - k, n)?;
                let inds = ops::stop_gradient(&inds, None)?;
                let mut weights = ops::take_along_axis(&scores, &inds, -1, None)?;
                if norm_topk_prob {
                    let d =
                        ops::add_scalar(&ops::sum(&weights, &[-1], true, None)?, 1e-20f32, None)?;
                    weights = (&weights / &d)?;
                }
                let weights = ops::multiply_scalar(&weights, routed_scaling_factor as f32, None)?
                    .astype(x_in.dtype())?;
                (inds, weights, false)
            }
            Router::NormalizedTopK { sigmoid } => {
                let g = gates.astype(Dtype::Float32)?;
                let g = if sigmoid {
                    ops::sigmoid(&g, None)?
                } else {
                    ops::softmax(&g, &[-1], false, None)?
                };
                let inds = lower_top_k(&g, k)?;
                let scores = ops::take_along_axis(&g, &inds, -1, None)?;
                let total = ops::maximum(
                    &ops::sum(&scores, &[-1], true, None)?,
                    &Array::from_f32(1e-12, scores.dtype())?,
                    None,
                )?;
                (inds, (&scores / &total)?, true)
            }
        })
    }
}

/// phimoe.py's `sparsemixer(gates, top_k, jitter_eps)`, op for op.
fn sparsemixer(gates: &Array, k: i32, jitter_eps: f64) -> Result<(Array, Array)> {
    let mut masked = gates.clone();
    let (mut inds, mut scores) = (Vec::new(), Vec::new());
    let neg_inf = Array::from_f32(f32::NEG_INFINITY, gates.dtype())?;
    let abs_gates = ops::abs(gates, None)?;
    for _ in 0..k {
        let top = masked.max(&[-1], true)?;
        let ind = ops::stop_gradient(&masked.argmax(-1, true)?, None)?;
        let factor = ops::maximum(&abs_gates, &top, None)?;
        let rel = (&(&top - gates)? / &factor)?;
        // `> 2 * jitter_eps`: a Python float, weak in the ratio's dtype.
        let far = ops::greater(
            &rel,
            &Array::from_f32((2.0 * jitter_eps) as f32, rel.dtype())?,
            None,
        )?;
        let band = ops::where_(&far, &neg_inf, &masked, None)?;
        let band = ops::softmax(&band, &[-1], true, None)?;
        scores.push(ops::take_along_axis(&band, &ind, -1, None)?);
        masked = ops::put_along_axis(&masked, &ind, &neg_inf, -1, None)?;
        inds.push(ind);
    }
    let inds: Vec<&Array> = inds.iter().collect();
    let scores: Vec<&Array> = scores.iter().collect();
    Ok((
        ops::concatenate(&inds, -1, None)?,
        ops::concatenate(&scores, -1, None)?,
    ))
}

/// The `n_drop` weakest of `n_group` groups of `scores`, ranked by the sum of their two best
/// scores, set to `fill`: `unflatten`, `topk(2).sum`, `argpartition(kth=n_drop - 1,
/// axis=-2)[..., :n_drop, :]`, `put_along_axis`, `flatten`. With no group to drop the groups
/// are ranked and kept (mlx-lm's `[..., :0, :]` picks none).
fn drop_groups(scores: &Array, n_group: i32, n_drop: i32, fill: &Array) -> Result<Array> {
    let grouped = ops::unflatten(scores, -1, &[n_group, -1], None)?;
    let group_scores = ops::sum(&ops::topk(&grouped, 2, -1, None)?, &[-1], true, None)?;
    if n_drop <= 0 {
        return Ok(ops::flatten(&grouped, -2, -1, None)?);
    }
    let idx = ops::slice_axis(
        &ops::argpartition(&group_scores, n_drop - 1, -2, None)?,
        -2,
        0,
        n_drop,
        None,
    )?;
    let dropped = ops::put_along_axis(&grouped, &ops::stop_gradient(&idx, None)?, fill, -2, None)?;
    Ok(ops::flatten(&dropped, -2, -1, None)?)
}

/// `stop_gradient(argpartition(-gates, kth=k - 1, axis=-1)[..., :k])`.
pub(crate) fn lower_top_k(gates: &Array, k: i32) -> Result<Array> {
    let neg = ops::negative(gates, None)?;
    let inds = ops::slice_axis(&ops::argpartition(&neg, k - 1, -1, None)?, -1, 0, k, None)?;
    Ok(ops::stop_gradient(&inds, None)?)
}

/// A layer's feed-forward block: a dense MLP or the experts.
#[derive(Clone)]
pub(crate) enum Ffn {
    Dense(Mlp),
    Sparse(Box<SparseMoe>),
}

impl Ffn {
    /// Walks the dense MLP (gate, down, up) or the experts' block.
    pub(crate) fn walk<'a>(&'a mut self, path: &str, w: &mut Walk<'a>) {
        match self {
            Ffn::Dense(m) => m.walk(path, &MlpNames::LLAMA, w),
            Ffn::Sparse(m) => m.walk(path, w),
        }
    }

    pub(crate) fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Ffn::Dense(m) => m.forward(x),
            Ffn::Sparse(m) => m.forward(x),
        }
    }
}

impl SparseMoe {
    /// qwen3_5's `shard()` of its `SparseMoeBlock` (`path` = `...mlp`): the gated shared
    /// expert's gate and up split by output rows and its down by input columns in place (its
    /// sigmoid gate whole), the experts likewise, and the block's output summed.
    pub(crate) fn shard_gated_shared_in_place(
        &mut self,
        size: i32,
        rank: i32,
        path: &str,
    ) -> Result<()> {
        use crate::shard::switch_inplace;
        if self.plain_shared.is_some() || self.coefficient.is_some() {
            return Err(ModelError::Parallel {
                kind: crate::Parallelism::Tensor,
                what: path.to_string(),
                problem: "an ungated or mixed shared expert cannot be sharded here".into(),
            });
        }
        if let Some((shared, _gate)) = self.shared_expert.as_mut() {
            let sp = format!("{path}.shared_expert");
            crate::shard::shard_mlp(shared, size, rank, &sp, true)?;
        }
        let e = &mut self.switch_mlp;
        let w = |n: &str| format!("{path}.{}.{n}", self.names[1]);
        switch_inplace(&mut e.gate_proj, true, size, rank, &w("gate_proj"))?;
        switch_inplace(&mut e.down_proj, false, size, rank, &w("down_proj"))?;
        switch_inplace(&mut e.up_proj, true, size, rank, &w("up_proj"))?;
        self.sharded = true;
        Ok(())
    }
}
