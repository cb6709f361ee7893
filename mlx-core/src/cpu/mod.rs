//! CPU kernels for a decode step run outside MLX's graph: matrix products over MLX's own
//! weight layouts (dense float, affine-quantized), RMSNorm, RoPE, SwiGLU and decode attention
//! over a float32 cache, on all cores through a persistent [`ThreadPool`].
//!
//! Why outside MLX: MLX 0.32.4's CPU quantized matmul is scalar and single-threaded, so a small
//! model decodes an order of magnitude below what the cores and memory allow. These kernels
//! read the model's own evaluated host buffers in place ([`crate::Array::as_slice`]): no
//! second copy of the weights. They are the building blocks of mlx-engine's CPU decoder.
//!
//! Dispatch is at run time ([`Isa::detect`]): AVX2 + FMA + F16C where the CPU has them, else
//! portable scalar code (also the path every other architecture compiles). Both give the same
//! results up to the order of float sums (tier L3 against MLX's ops: see each test's bound).
//!
//! Nothing here allocates per call except where a function says so; scratch space is the
//! caller's or on the stack.

#[cfg(target_arch = "x86_64")]
mod affine_rows;
#[cfg(target_arch = "x86_64")]
pub mod amx;
#[cfg(target_arch = "x86_64")]
pub mod amx_verify;
mod batch;
#[cfg(target_arch = "x86_64")]
mod kgemm;
pub mod kquant;
#[cfg(target_arch = "x86_64")]
mod kquant_x86;
mod lanes;
mod matmul;
mod ops;
mod pages;
mod pool;
#[cfg(target_arch = "x86_64")]
mod prompt_attn;
pub mod trellis;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use batch::{
    matmul_t_each, matmul_t_each_prefetch, matmul_t_each_with, KvPrefetch, RowsScratch,
};
pub use lanes::{Lanes16, LanesStore};
pub use matmul::{matmul_t, Floats, MatJob, Matrix, MAX_JOBS};
pub use ops::{
    attention, attention_f16, gelu_approx_mul_isa, greedy_lse, rms_norm, rope, rope_inv_freqs,
    rope_pair, silu_mul, silu_mul_isa, AttentionShape, MAX_HEAD_DIM,
};
pub use pages::prefer_huge_pages;
pub use pool::{available_threads, Regions, ThreadPool, MAX_REGIONS};
#[cfg(target_arch = "x86_64")]
pub use prompt_attn::{attention_prompt, attention_prompt_f16, prompt_applies, PROMPT_MIN_M};

/// Hands back the calling thread's prompt-block input buffers, which grow to a prompt
/// block's inputs and stay for the thread's life otherwise: the prompt attention's
/// transposed keys (384 KiB at 512 positions of SmolLM2), the AMX products' input lines
/// (384 KiB for 64 rows of 1,536) and the GGML block products' transposed and int16 inputs.
/// For a caller whose prompt is in (`mlx generate` before its decode steps: issue #31's
/// peak memory); a later prompt block makes them again. Workers' buffers stay.
pub fn release_prompt_buffers() {
    #[cfg(target_arch = "x86_64")]
    {
        prompt_attn::release_prompt_keys();
        amx::release_inputs();
        kgemm::release_inputs();
    }
}

/// The instruction set a kernel runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust (the fallback, and the reference the SIMD paths are tested against).
    Scalar,
    /// x86-64 AVX2 with FMA and F16C.
    Avx2,
    /// x86-64 AVX2, FMA and F16C plus AVX-512 F/BW/VL with VNNI: the AVX2 kernels, and
    /// 512-bit integer dot products (`vpdpwssd`) for the int16-activation products.
    Avx512,
}

impl Isa {
    /// The best instruction set this CPU supports.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                if std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
                {
                    return Isa::Avx512;
                }
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Whether this CPU can run `self`.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => Isa::detect().has_avx2(),
            Isa::Avx512 => Isa::detect() == Isa::Avx512,
        }
    }

    /// Whether the AVX2 + FMA + F16C kernels run on `self` (also true of [`Isa::Avx512`]).
    pub fn has_avx2(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::Avx512)
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2+fma",
            Isa::Avx512 => "avx512+vnni",
        }
    }
}

/// How the matrix products read their float inputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activations {
    /// As given (float32 products: the exact path's numerics up to summation order).
    #[default]
    F32,
    /// Quantized to int8 per 32 values for the 4-bit products of one to four inputs (integer
    /// dot products, as llama.cpp's Q8_1 activations; AVX2 only, else as `F32`). Adds a
    /// relative error of about 1/254 of each chunk's largest input to each product's terms.
    Int8,
    /// Quantized to int16 per 32 values for the 4- and 8-bit products of one to four inputs
    /// (AVX2 only, else as `F32`) and for a prompt block's GGML products on AVX-512
    /// (`cpu::kgemm`'s int16 panels): integer dot products with an input error of at most
    /// 1/65534 of each chunk's largest input, 256 times less than `Int8`'s.
    Int16,
    /// As `Int16`, but the 8-bit products in groups of 32 with half-precision scales (GGUF's
    /// Q8_0 as loaded) of one to four inputs quantized to int8 per 32 values (natural order)
    /// and summed by AVX-512 VNNI's `vpdpbusd`, a quarter of the int16 kernel's
    /// instructions; where the CPU lacks AVX-512 VNNI those take the int16 kernel. Only
    /// through [`matmul_t_each`] (decode steps); [`matmul_t`] takes it as `Int16` (a prompt
    /// block's GGML products on AVX-512: `cpu::kgemm`'s int16 panels). The logits' product
    /// takes [`Activations::head`] (`Int16`): int8 inputs to SmolLM2's Q8_0 tied head moved
    /// a step's log-probabilities by up to 0.09 and its short greedy reply parted from the
    /// exact path's at the third token.
    Int16Q8Int8,
    /// As `Int16Q8Int8`, and the 4-bit products (groups of 32 times a power of two) of one to
    /// four inputs too read int8 inputs (llama.cpp's Q8_0 activations: one scale per 32
    /// values, the biases times the exact float sums) summed by AVX-512 VNNI's `vpdpbusd`,
    /// a quarter of the int16 kernel's multiplies. Adds a relative error of about 1/254 of
    /// each chunk's largest input to each product's terms, as `Int8`. Where the CPU lacks
    /// AVX-512 VNNI, as `Int16Q8Int8`. Only through [`matmul_t_each`]; [`matmul_t`] takes
    /// it as `Int16`. Not the CPU decoder's default: on SmolLM2-135M it fails the quality
    /// gate (results/bench/2026-12-04-cpu-session19/README.md).
    Int8Vnni,
    /// As `Int8Vnni` for the products whose inputs are RMSNorm outputs (the caller says
    /// which: [`matmul_t_each_with`] and [`Activations::unnormed`]), as `Int16Q8Int8` for the
    /// others (an attention output, SwiGLU's product), whose outlier channels int8 per 32
    /// values flattens.
    Int8Normed,
}

impl Activations {
    /// What the head's product (the logits) takes: `Int16` for `Int16Q8Int8`, else the same.
    /// A Q8_0 head read through int8 inputs (a relative error of 1/254 of each chunk of 32's
    /// largest input) moved SmolLM2's log-probabilities by up to 0.09 where int16 inputs keep
    /// them within 0.003 of the exact path (`--prompt-ids 1,4093,198`, step 1: -2.130 and
    /// -2.218 against -2.216); the logits are what sampling reads.
    pub fn head(self) -> Activations {
        match self {
            Activations::Int16Q8Int8 => Activations::Int16,
            a => a,
        }
    }

    /// What a product whose inputs are not an RMSNorm's output takes: `Int16Q8Int8` for
    /// `Int8Normed`, else the same.
    pub fn unnormed(self) -> Activations {
        match self {
            Activations::Int8Normed => Activations::Int16Q8Int8,
            a => a,
        }
    }
}

/// A pool and the instruction set its kernels use.
#[derive(Debug)]
pub struct CpuContext {
    pub pool: ThreadPool,
    pub isa: Isa,
    /// Float32 by default.
    pub activations: Activations,
    /// The 4-bit products over int16 inputs on AVX-512 through the split-byte kernel
    /// (`x86::dot4_512_s`: the inputs' codes as high and low bytes, `vpdpbusd`), the default;
    /// false: the pair kernel (`x86::dot4_512_g`, `vpmaddwd` + `vpdpwssd`), the same integer
    /// sums scaled in another order. For measuring the two side by side.
    pub split4: bool,
    /// Whether a prompt block's 4- and 8-bit affine products under int16 activations run on
    /// AMX's bfloat16 tiles (`cpu::amx`): set where the CPU and OS have them; clear it to keep
    /// the AVX-512 kernels.
    pub amx: bool,
    /// The 4-bit float16 affine products over int16 inputs on AVX-512 (the decode step's and
    /// the verification pass's) through `amx_verify::rows` (chunk-sum arithmetic, rows in the
    /// vector lanes: other bits than the default kernel's, cheaper extra rows). Off by default;
    /// `MLX_CPU_LANE4=1` sets it ([`lane4_from_env`]). An experiment of #33 (session 28).
    /// Matrices with a lane layout attached ([`Matrix::with_lanes`]) take
    /// `amx_verify::rows_lanes` instead (the same bits, no transposes).
    pub lane4: bool,
}

/// Whether `MLX_CPU_LANE4` is `1` (what [`CpuContext::lane4`] starts as).
pub fn lane4_from_env() -> bool {
    std::env::var("MLX_CPU_LANE4").is_ok_and(|v| v == "1")
}

impl CpuContext {
    /// `threads` workers (0: all available) on the best instruction set.
    pub fn new(threads: usize) -> crate::Result<CpuContext> {
        Self::with_isa(threads, Isa::detect())
    }

    /// As [`CpuContext::new`] on a given instruction set (an error where the CPU lacks it).
    pub fn with_isa(threads: usize, isa: Isa) -> crate::Result<CpuContext> {
        if !isa.available() {
            return Err(crate::Error::invalid(
                "CpuContext",
                format!("this CPU cannot run the {} kernels", isa.name()),
            ));
        }
        let threads = if threads == 0 {
            available_threads()
        } else {
            threads
        };
        let amx = amx_available(isa);
        Ok(CpuContext {
            pool: ThreadPool::new(threads)?,
            isa,
            activations: Activations::F32,
            split4: true,
            amx,
            lane4: lane4_from_env(),
        })
    }

    /// The kernels' name: the instruction set's, with `+amx` where [`CpuContext::amx`] is set.
    pub fn kernels(&self) -> &'static str {
        kernels_name(self.isa, self.amx)
    }
}

/// The name of the kernels on `isa` with AMX's prompt-block tiles (`amx`) or not: the
/// instruction set's ([`Isa::name`]), with `+amx` where AMX runs (only on [`Isa::Avx512`]).
pub fn kernels_name(isa: Isa, amx: bool) -> &'static str {
    match (isa, amx) {
        (Isa::Avx512, true) => "avx512+vnni+amx",
        (isa, _) => isa.name(),
    }
}

/// Whether a [`CpuContext`] made now on `isa` would have [`CpuContext::amx`] set (the CPU and
/// operating system run AMX's bfloat16 tiles: [`amx::available`]).
pub fn amx_available(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa == Isa::Avx512 && amx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// A raw pointer to an output buffer that several workers write at disjoint indices.
#[derive(Clone, Copy)]
pub(crate) struct SharedOut {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: workers only write disjoint indices (each kernel partitions its output), and the
// buffer outlives the pool run that uses it (borrowed mutably by the caller for its length).
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    pub(crate) fn new(out: &mut [f32]) -> SharedOut {
        SharedOut {
            ptr: out.as_mut_ptr(),
            len: out.len(),
        }
    }

    /// Writes `v` at `i` (bounds-checked).
    ///
    /// # Safety
    /// No other thread reads or writes index `i` during the pool run.
    #[inline]
    pub(crate) unsafe fn write(self, i: usize, v: f32) {
        assert!(i < self.len, "output index {i} out of {}", self.len);
        // SAFETY: in bounds (checked); exclusive per the contract.
        unsafe { *self.ptr.add(i) = v }
    }

    /// The sub-slice `[start, start + n)` for exclusive use by one worker.
    ///
    /// # Safety
    /// No other thread touches that range during the pool run, and the returned slice does not
    /// outlive it.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn range<'a>(self, start: usize, n: usize) -> &'a mut [f32] {
        assert!(
            start.checked_add(n).is_some_and(|e| e <= self.len),
            "output range {start}+{n} out of {}",
            self.len
        );
        // SAFETY: in bounds (checked); exclusive per the contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), n) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The statistics line's names: `+amx` only where AMX's tiles run, on AVX-512.
    #[test]
    fn kernels_names() {
        assert_eq!(kernels_name(Isa::Avx512, true), "avx512+vnni+amx");
        assert_eq!(kernels_name(Isa::Avx512, false), "avx512+vnni");
        assert_eq!(kernels_name(Isa::Avx2, true), "avx2+fma");
        assert_eq!(kernels_name(Isa::Scalar, false), "scalar");
        let isa = Isa::detect();
        let ctx = CpuContext::with_isa(1, isa).unwrap();
        assert_eq!(ctx.amx, amx_available(isa));
        assert_eq!(ctx.kernels(), kernels_name(isa, amx_available(isa)));
    }
}

/// The seeded generator the kernels' tests draw their inputs from (one LCG, Knuth's MMIX
/// constants).
#[cfg(test)]
pub(crate) mod test_rng {
    pub(crate) struct Lcg(pub(crate) u64);

    impl Lcg {
        /// The next 31 random bits.
        pub(crate) fn next(&mut self) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) as u32
        }

        /// A value in [-0.5, 0.5).
        pub(crate) fn unit(&mut self) -> f32 {
            self.next() as f32 / (1u64 << 31) as f32 - 0.5
        }
    }
}
