//! mlx-lm 0.32.2 model types that [`super::build`] does not serve, each with the reason: `mlx
//! models` lists them, and `cargo xtask port-check` (no arguments) fails on a type of mlx-lm's
//! `models/` that is neither served nor listed here. Porting a type removes its line.

/// Why a type is not served.
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unserved {
    /// mlx-lm itself cannot run it on MLX's CPU backend.
    NoCpu,
    /// Not ported yet.
    NotYet,
}

/// `(model_type, why, reason)`, sorted by type.
pub const UNSERVED: &[(&str, Unserved, &str)] = &[(
    "muse_spark",
    Unserved::NoCpu,
    "mlx-lm calls its fused Metal kernels (mlx_lm.kernels: qk_norm, expert_routing, \
         norm_add_norm) unconditionally",
)];
