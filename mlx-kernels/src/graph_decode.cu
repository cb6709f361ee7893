// The graph decoder's kernels (mlx-kernels/src/graph_decode.rs): one llama decode step as
// 5 kernels a layer, captured once into a CUDA graph and replayed for every token.
//
// Compiled by NVRTC at run time with no includes. Every parameter is 8 bytes wide (pointers,
// long long, double): the runtime checks launches against that. Activations are bfloat16
// values rounded where MLX rounds them (after each op), arithmetic in float32.
//
// The step state lives on the device: state[0] the token to embed, state[1] its position
// (where its keys and values go; attention covers state[1] + 1 positions), state[2] the
// number of steps taken (the index the next sampled token is written at), state[3] the row's
// place in a verify group (0 elsewhere; see below).
//
// Batched decode: NB sequences (rows) a step, NB set by the host (1 by default). Row b has its
// own state (state + 4 b; a position below 0 marks the row idle: it writes no cache and samples
// nothing), its own cache slot (kc, vc + b nkv cap D) and activations (each buffer's row b at
// b times its row's size). The matrix-vector kernels read each weight once for all rows.
//
// Verification (speculative decoding): rows b - j .. b of a group share row b - j's cache slot
// at consecutive positions, row b's state[3] = j (its place in the group). The q/k/v kernel
// writes every row's keys and values before attention runs, so row b's attention over
// positions 0 .. state[1] sees the keys of the rows before it; its last j + 1 positions are
// written in the same step (attention loads them after its wait).

typedef unsigned short bf16_t;
typedef unsigned int u32;
typedef long long ll;

// The persistent step's layer loop (GRAPH_PERSIST with PS_LOOP) only; the kernels' sources
// keep the built-ins and define nothing here.
// - On the device every body is inlined into one kernel, where the compiler would compute what
//   the bodies derive from the thread's and block's indices and the grid's size (lanes, warps,
//   strides, shared-memory addresses) once, before the loop, and keep it live (spilled) across
//   every phase. Read through an opaque `asm volatile` where each body reads them, they are
//   each body's own: recomputed in its phase, dead after it.
// - PS_ZERO defines every register a body loads only on some paths (the pieces past an input's
//   end, the keys a chunk lacks): left unset, the value from the loop's previous phase would
//   flow into it, and ptxas keeps such registers live around the whole loop (spilled). The bits
//   are the same (no path reads the zero: every use is behind the same condition as the load).
#if defined(GRAPH_PERSIST) && defined(PS_LOOP)
#if GRAPH_PERSIST && PS_LOOP
#define PS_ZERO = {}
#ifdef __CUDA_ARCH__
// x through the asm (y and z, unused by the bodies here, as the built-ins).
#define PS_SREG(FN, B, REG)                                 \
  __device__ __forceinline__ uint3 FN() {                   \
    uint3 r;                                                \
    asm volatile("mov.u32 %0, " REG ";" : "=r"(r.x));       \
    r.y = B.y;                                              \
    r.z = B.z;                                              \
    return r;                                               \
  }
PS_SREG(ps_tid, threadIdx, "%%tid.x")
PS_SREG(ps_ctaid, blockIdx, "%%ctaid.x")
PS_SREG(ps_ntid, blockDim, "%%ntid.x")
#undef PS_SREG
__device__ __forceinline__ dim3 ps_nctaid() {
  unsigned int x;
  asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(x));
  return dim3(x, gridDim.y, gridDim.z);
}
#define threadIdx ps_tid()
#define blockIdx ps_ctaid()
#define blockDim ps_ntid()
#define gridDim ps_nctaid()
#endif
#endif
#endif
#ifndef PS_ZERO
#define PS_ZERO
#endif

#define NEG_INF __int_as_float(0xff800000)
#define MV_WARPS 8
#define MODE_NORM 1
#define MODE_RES 2
#define MODE_SWIGLU 4
#define MODE_F32 8
#define MODE_GELU 16
#define ATTN_CHUNK 64
#define ATTN_THREADS 128
// Partial outputs the combining block loads together with the chunks' maxima and sums (the
// chunks of a prompt of up to ATTN_EARLY * ATTN_CHUNK positions in one round trip).
#define ATTN_EARLY 12
// Rows a warp computes at once in the matrix-vector products: 2 or 4 (set by the host).
#ifndef MV_ROWS
#define MV_ROWS 2
#endif
// Sequences a step (see the top).
#ifndef NB
#define NB 1
#endif
// Tensor-core tiles (set by the host for tiles of MMA_MIN_SEQUENCES sequences or more, 0
// otherwise): 4-bit weights in groups of 64 go through mma.sync m16n8k16 (mv_run_mma).
#ifndef MV_MMA
#define MV_MMA 0
#endif
// Blocks of a matrix-vector kernel a multiprocessor holds at once: two with one sequence (at
// most 128 registers a thread); with several, their inputs fill the shared memory of one, and
// their sums take the registers of two. The host sets it (GraphOptions::min_blocks_per_sm,
// for A/B runs), and to two for tensor-core tiles of a 4-bit model in groups of 64, whose
// products all take mv_run_mma: the kernel's count would be its FFMA fallbacks' (248 at 7
// sequences: one block, 8 warps, each item a chain of 4 dependent mma.sync), while the MMA
// path keeps ~5 local loads an item at 128 (results/gpu/2026-12-05-s32-rows).
#ifndef MV_MIN_BLOCKS
#if NB == 1
#define MV_MIN_BLOCKS 2
#else
#define MV_MIN_BLOCKS 1
#endif
#endif

__device__ __forceinline__ float bf2f(bf16_t h) { return __uint_as_float(((u32)h) << 16); }
__device__ __forceinline__ float lo2f(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi2f(u32 w) { return __uint_as_float(w & 0xffff0000u); }

// Round to nearest even, as MLX's bfloat16 conversion does; NaN stays NaN.
__device__ __forceinline__ bf16_t f2bf(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16_t)(u >> 16);
}
__device__ __forceinline__ float rbf(float f) { return bf2f(f2bf(f)); }

// Programmatic dependent launch (sm_90; no-ops when a kernel is launched without it): wait for
// the kernel before this one to finish and flush, then let the next one start its blocks.
__device__ __forceinline__ void pdl_wait_then_release() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The wait of a kernel's blocks for the kernel before it, as the row and attention bodies take
// it (their kernels pass this one; the persistent step, GRAPH_PERSIST, a grid barrier), and
// the barrier of a body's threads (the kernels': the block's).
struct PdlWait {
  __device__ __forceinline__ void operator()() const { pdl_wait_then_release(); }
};
struct BlockSync {
  __device__ __forceinline__ void operator()() const { __syncthreads(); }
};
// The block and thread a body runs as (its kernel's: blockIdx, threadIdx; read where used).
struct KernelIdx {
  __device__ __forceinline__ ll x() const { return blockIdx.x; }
  __device__ __forceinline__ ll y() const { return blockIdx.y; }
  __device__ __forceinline__ int t() const { return threadIdx.x; }
  __device__ __forceinline__ unsigned ux() const { return blockIdx.x; }
  __device__ __forceinline__ unsigned ut() const { return threadIdx.x; }
  __device__ __forceinline__ ll gx() const { return gridDim.x; }
};

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

typedef unsigned long long u64;

// The step's timeline (GraphDecoder::trace_step; a null buf, as in the replayed step, traces
// nothing): thread 0 of every block of the q/k/v, attention and matrix-vector kernels notes
// %globaltimer at entry, after the wait, after its prologue and at its end, and appends one
// record of 8 words: what ran (kernel | mode << 8 | K << 16), block (x | y << 32), SM, the
// four times, and for the matrix-vector kernels when thread 0's first weights were there
// (waited for after the prologue; 0 elsewhere). buf[0] counts the records, buf[1] is the
// room; record i sits at buf + 8 (i + 1).
__device__ __forceinline__ u64 gtime() {
#ifdef __CUDA_ARCH__
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  // The emulator's: a counter every read of it advances, so its traces can check the order.
  static u64 emu_time = 0;
  return __atomic_add_fetch(&emu_time, 1ull, __ATOMIC_SEQ_CST);
#endif
}
__device__ __forceinline__ u64 sm_id() {
#ifdef __CUDA_ARCH__
  u32 v;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
  return v;
#else
  return 0;
#endif
}
struct Trace {
  u64* buf;
  u64 t[4];
  __device__ __forceinline__ void mark(int i) {
    if (buf && threadIdx.x == 0) t[i] = gtime();
  }
  // Waits for a loaded word (its register), then notes the time in t[3]: an instruction
  // with a side effect predicated on the word cannot issue, and the timer read after it
  // cannot either, before the word is there.
  __device__ __forceinline__ void arrived(u32 w) {
    if (!buf || threadIdx.x != 0) return;
#ifdef __CUDA_ARCH__
    if (w == 0x9E3779B9u) asm volatile("nanosleep.u32 0;");
#endif
    t[3] = gtime();
  }
  __device__ __forceinline__ void done(u64 what) {
    if (!buf || threadIdx.x != 0) return;
    const u64 end = gtime();
    const u64 i = atomicAdd(buf, 1ull);
    if (i >= buf[1]) return;
    u64* r = buf + 8 * (i + 1);
    r[0] = what;
    r[1] = (u64)blockIdx.x | ((u64)blockIdx.y << 32);
    r[2] = sm_id();
    r[3] = t[0];
    r[4] = t[1];
    r[5] = t[2];
    r[6] = end;
    r[7] = t[3];
  }
};
#define TRACE_QKV 1
#define TRACE_ATTENTION 2
#define TRACE_MATVEC 3

// The rotation of RoPE pair i at position pos, as MLX's fast.rope computes it: theta =
// (pos * pos_scale) * inv_freq[i] (the model's own inverse frequencies: a base, linear
// scaling, llama3's or yarn's table), its cosine and sine, both times out_scale (yarn's mscale
// on the rotated features; 1 otherwise).
__device__ __forceinline__ void rope_angle(int i, int pos, const float* inv_freq,
                                           double pos_scale, double out_scale, float& c,
                                           float& s) {
  const float L = (float)pos_scale * (float)pos;
  const float theta = L * inv_freq[i];
  c = cosf(theta) * (float)out_scale;
  s = sinf(theta) * (float)out_scale;
}

// h = embedding row state[0] (bfloat16 table, or MLX affine-quantized: dequantize(w, S, B), the
// scales and biases as MLX holds them)
// times emb_scale (Gemma's sqrt(hidden), a bfloat16 value, rounded as MLX multiplies in the
// activations' dtype; 1 elsewhere: exact), and the step's RoPE tables: rope[i] and
// rope[half + i], the cosine and sine of pair i at position state[1], for the nrot rotated
// pairs i < nrot <= half (read by matvec_qkv's epilogue); with nrot2 > 0 a second table (the
// sliding layers' own RoPE: Gemma 3's local base) at rope + 2 half, from inv_freq2.
// EMBED_BATCH (16 with the host's switch MLX_GRAPH_EARLY_PROLOGUE=1; 1 otherwise, the loop as
// it was): the values a thread loads before storing them.
#ifndef EMBED_BATCH
#define EMBED_BATCH 1
#endif
// embed's body (the kernel below; the persistent step's first phase): block ix.ux() (the row),
// thread ix.ut(), its wait passed in.
template <class Wait, class Idx>
__device__ __forceinline__ void embed_body(const void* table, const bf16_t* S, const bf16_t* B,
                                           const int* state, bf16_t* h, ll H, ll bits, ll gs,
                                           float* rope, ll half, ll nrot, const float* inv_freq,
                                           double pos_scale, double out_scale, double emb_scale,
                                           ll nrot2, const float* inv_freq2, double pos_scale2,
                                           double out_scale2, Idx ix, Wait& wait) {
  wait();
  const int b = ix.ux();  // the row
  state += 4 * b;
  h += (ll)b * H;
  rope += (ll)b * 4 * half;
  // An idle row embeds token 0 (its results are never read).
  const ll tok = state[1] < 0 ? 0 : state[0];
  const int pos = state[1] < 0 ? 0 : state[1];
  for (int i = ix.ut(); i < nrot; i += blockDim.x)
    rope_angle(i, pos, inv_freq, pos_scale, out_scale, rope[i], rope[half + i]);
  float* rope2 = rope + 2 * half;
  for (int i = ix.ut(); i < nrot2; i += blockDim.x)
    rope_angle(i, pos, inv_freq2, pos_scale2, out_scale2, rope2[i], rope2[half + i]);
#if EMBED_BATCH > 1
  // EMBED_BATCH values a thread: every load first (the code words, scales and biases, or the
  // bfloat16 values, into registers; the row's offsets in 32 bits, k < H: the same quotients),
  // then the same arithmetic and stores as the loop below, whose store may alias the next
  // value's scale and bias for the compiler: each value waits a memory latency there, 16 in
  // turn at 8B (results/gpu/2026-12-06-s37-stepgap).
  const ll per = bits == 16 ? 1 : 32 / bits;
  const u32* w = (const u32*)table + (bits == 16 ? 0 : tok * (H / per));
  const bf16_t* Sr = S + (bits == 16 ? 0 : tok * (H / gs));
  const bf16_t* Br = B + (bits == 16 ? 0 : tok * (H / gs));
  const int pi = (int)per, gi = (int)gs;
  for (ll k0 = ix.ut(); k0 < H; k0 += EMBED_BATCH * (ll)blockDim.x) {
    u32 wv[EMBED_BATCH];
    bf16_t sv[EMBED_BATCH], bv[EMBED_BATCH];
#pragma unroll
    for (int j = 0; j < EMBED_BATCH; ++j) {
      const int k = (int)(k0 + j * (ll)blockDim.x);
      if (k < H) {
        if (bits == 16) {
          wv[j] = ((const bf16_t*)table)[tok * H + k];
        } else {
          wv[j] = w[k / pi];
          sv[j] = Sr[k / gi];
          bv[j] = Br[k / gi];
        }
      }
    }
#pragma unroll
    for (int j = 0; j < EMBED_BATCH; ++j) {
      const int k = (int)(k0 + j * (ll)blockDim.x);
      if (k < H) {
        float v;
        if (bits == 16) {
          v = bf2f((bf16_t)wv[j]);
        } else {
          const u32 q = (wv[j] >> ((k % pi) * bits)) & ((1u << bits) - 1u);
          v = rbf(rbf(bf2f(sv[j]) * (float)q) + bf2f(bv[j]));
        }
        h[k] = f2bf(v * (float)emb_scale);
      }
    }
  }
#else
  for (ll k = ix.ut(); k < H; k += blockDim.x) {
    float v;
    if (bits == 16) {
      v = bf2f(((const bf16_t*)table)[tok * H + k]);
    } else {
      const ll per = 32 / bits;
      const u32* w = (const u32*)table + tok * (H / per);
      const u32 q = (w[k / per] >> ((k % per) * bits)) & ((1u << bits) - 1u);
      const ll g = tok * (H / gs) + k / gs;
      v = rbf(rbf(bf2f(S[g]) * (float)q) + bf2f(B[g]));
    }
    h[k] = f2bf(v * (float)emb_scale);
  }
#endif
}
extern "C" __global__ void embed(const void* table, const bf16_t* S, const bf16_t* B,
                                 const int* state, bf16_t* h,
                                 ll H, ll bits, ll gs, float* rope, ll half, ll nrot,
                                 const float* inv_freq, double pos_scale, double out_scale,
                                 double emb_scale, ll nrot2, const float* inv_freq2,
                                 double pos_scale2, double out_scale2) {
  PdlWait wait;
  embed_body(table, S, B, state, h, H, bits, gs, rope, half, nrot, inv_freq, pos_scale,
             out_scale, emb_scale, nrot2, inv_freq2, pos_scale2, out_scale2, KernelIdx(), wait);
}

// Dot product of 8 bfloat16 weights with 8 bfloat16 inputs, added to acc.
__device__ __forceinline__ float dot8(const uint4 w, const uint4 x, float acc) {
  acc += lo2f(w.x) * lo2f(x.x);
  acc += hi2f(w.x) * hi2f(x.x);
  acc += lo2f(w.y) * lo2f(x.y);
  acc += hi2f(w.y) * hi2f(x.y);
  acc += lo2f(w.z) * lo2f(x.z);
  acc += hi2f(w.z) * hi2f(x.z);
  acc += lo2f(w.w) * lo2f(x.w);
  acc += hi2f(w.w) * hi2f(x.w);
  return acc;
}

// The input vector sits in shared memory as bfloat16 in 16-byte slots, slot t stored at
// xs_slot(t): a quarter-warp's lanes reading consecutive 16, 32 or 64-byte pieces (one
// chunk of bfloat16 weights, of 8-bit or of 4-bit codes) then hit distinct banks.
__device__ __forceinline__ int xs_slot(int t) { return t ^ ((t >> 3) & 3); }

// The codes of a word as floats, scaled by powers of two, without integer conversions: code j
// is masked in place under the exponent of 2^23 (whose mantissa's lowest bit weighs 1), and
// 2^23 is subtracted: one logic op and one add a code. With one exponent for every code, code
// j of a 4-bit word comes out as code * 16^(j % 4) (the high half shifted down once a word),
// of an 8-bit word as code * 256^(j % 2); the inputs they multiply are stored divided by the
// same powers (xs_scale), so every product is the one of the unscaled values, bit for bit.
#define CODE_EXP 0x4B000000u
#define CODE_OFF 8388608.f
// (w & M) | CODE_EXP in one instruction, the exponent in a register: left to itself the
// compiler splits it in two, an AND and an OR, each with its constant as an immediate.
template <u32 M>
__device__ __forceinline__ float code_at(u32 w) {
#ifdef __CUDA_ARCH__
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(w), "n"(M), "r"(CODE_EXP));
  return __uint_as_float(d) - CODE_OFF;
#else
  return __uint_as_float((w & M) | CODE_EXP) - CODE_OFF;
#endif
}
__device__ __forceinline__ void codes4(u32 w, float* q) {
  const u32 v = w >> 16;
  q[0] = code_at<0xFu>(w);
  q[1] = code_at<0xF0u>(w);
  q[2] = code_at<0xF00u>(w);
  q[3] = code_at<0xF000u>(w);
  q[4] = code_at<0xFu>(v);
  q[5] = code_at<0xF0u>(v);
  q[6] = code_at<0xF00u>(v);
  q[7] = code_at<0xF000u>(v);
}
__device__ __forceinline__ void codes8(u32 w, float* q) {
  const u32 v = w >> 16;
  q[0] = code_at<0xFFu>(w);
  q[1] = code_at<0xFF00u>(w);
  q[2] = code_at<0xFFu>(v);
  q[3] = code_at<0xFF00u>(v);
}

// MX fp4 (MLX's mxfp4 mode: gpt_oss's experts): 4-bit e2m1 codes (sign, 2 exponent bits, 1
// mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives), 8 a word, the lowest bits
// first, one e8m0 scale (a byte: 2^(e - 127)) a group of 32, no biases. Compiled only where
// MV_FP4 is 1 (the step source of a model with mxfp4 experts), so every other model compiles
// the kernels it always did. A code's magnitude doubled (an integer, 0 .. 12) is byte m of
// FP4_LO:FP4_HI (one byte_perm, the other three bytes byte 0's zero), as a float by the
// CODE_EXP trick, its sign bit OR'd in: exact, so the chunk's sum of code x input products is
// twice the true one, and the group's scale is halved to match (mv_fp4_scale: a power of two,
// exact).
#ifndef MV_FP4
#define MV_FP4 0
#endif
// The kernels' `bits` argument for mxfp4 weights (group 32; graph_decode.rs's BITS_MXFP4).
#define BITS_MXFP4 0x104
#define FP4_LO 0x03020100u
#define FP4_HI 0x0C080604u
// Code j (0 .. 7, a constant once unrolled) of word w, doubled.
__device__ __forceinline__ float fp4_at(u32 w, int j) {
  const u32 mag = __byte_perm(FP4_LO, FP4_HI, (w >> (4 * j)) & 7u);
  const u32 sgn = (j >= 7 ? w : w << (28 - 4 * j)) & 0x80000000u;
  return __uint_as_float(__float_as_uint(__uint_as_float(mag | CODE_EXP) - CODE_OFF) | sgn);
}
// An e8m0 scale halved (the codes are doubled): 2^(e - 128) as float bits (below 2^-126, for
// e < 2, a subnormal).
__device__ __forceinline__ u32 mv_fp4_scale(u32 e) {
  return e > 1u ? (e - 1u) << 23 : 0x00400000u >> (1u - e);
}

// An input slot (8 bfloat16 values) as the codes of `bits` bits multiply it: value i divided
// by 16^(i % 4) (4-bit) or 256^(i % 2) (8-bit). A power of two scales exactly, so the
// products' high halves are the bfloat16 quotients (a NaN stays NaN: arithmetic NaNs are
// quiet), unless a quotient is below bfloat16's normal range (|x| < 2^-114), where it is
// truncated.
__device__ __forceinline__ u32 scale2(u32 x, float lo, float hi) {
  return __byte_perm(__float_as_uint(lo2f(x) * lo), __float_as_uint(hi2f(x) * hi), 0x7632);
}
__device__ __forceinline__ uint4 xs_scale(uint4 o, ll bits) {
  if (bits == 4) {
    o.x = scale2(o.x, 1.f, 0.0625f);
    o.y = scale2(o.y, 0.00390625f, 0.000244140625f);
    o.z = scale2(o.z, 1.f, 0.0625f);
    o.w = scale2(o.w, 0.00390625f, 0.000244140625f);
  } else if (bits == 8) {
    o.x = scale2(o.x, 1.f, 0.00390625f);
    o.y = scale2(o.y, 1.f, 0.00390625f);
    o.z = scale2(o.z, 1.f, 0.00390625f);
    o.w = scale2(o.w, 1.f, 0.00390625f);
  }
  return o;
}

// Chunk c's N 16-byte pieces of bfloat16 inputs (slots c N .. c N + N - 1 of the swizzled
// shared input, xs_slot) as 8 N floats: qchunk's and qchunk_fp4's input load.
template <int N>
__device__ __forceinline__ void chunk_inputs(const bf16_t* xs, int c, float* x) {
  const uint4* xv = (const uint4*)xs;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const uint4 t = xv[xs_slot(c * N + i)];
    x[8 * i + 0] = lo2f(t.x);
    x[8 * i + 1] = hi2f(t.x);
    x[8 * i + 2] = lo2f(t.y);
    x[8 * i + 3] = hi2f(t.y);
    x[8 * i + 4] = lo2f(t.z);
    x[8 * i + 5] = hi2f(t.z);
    x[8 * i + 6] = lo2f(t.w);
    x[8 * i + 7] = hi2f(t.w);
  }
}

// Chunk c (16 bytes of each of MV_ROWS quantized rows: 4 words of BITS-bit codes, 32 / BITS a
// word, the lowest bits first) against the matching inputs: d[r] = sum(q_r * x).
template <int BITS>
__device__ __forceinline__ void qchunk(const uint4* w, const bf16_t* xs, int c, float* d) {
  constexpr int PER = 32 / BITS;
  constexpr int VALS = 4 * PER;
  float x[VALS];
  chunk_inputs<VALS / 8>(xs, c, x);
  // Each word's codes are summed on their own, then the words' sums in order: four short
  // chains of dependent adds a row rather than one long one.
  float t[4][MV_ROWS];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int r = 0; r < MV_ROWS; ++r) {
      const u32 word = i == 0 ? w[r].x : i == 1 ? w[r].y : i == 2 ? w[r].z : w[r].w;
      float q[PER];
      if (BITS == 4) {
        codes4(word, q);
      } else {
        codes8(word, q);
      }
      t[i][r] = q[0] * x[i * PER];
#pragma unroll
      for (int j = 1; j < PER; ++j) t[i][r] += q[j] * x[i * PER + j];
    }
  }
#pragma unroll
  for (int r = 0; r < MV_ROWS; ++r) d[r] = ((t[0][r] + t[1][r]) + t[2][r]) + t[3][r];
}

// qchunk for mxfp4 codes (16 bytes a row: 32 codes, one group) against the unscaled inputs:
// d[r] = 2 sum(code_r * x), each word's codes summed on their own, then the words' sums in
// order (qchunk's order).
__device__ __forceinline__ void qchunk_fp4(const uint4* w, const bf16_t* xs, int c, float* d) {
  float x[32];
  chunk_inputs<4>(xs, c, x);
  float t[4][MV_ROWS];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int r = 0; r < MV_ROWS; ++r) {
      const u32 word = i == 0 ? w[r].x : i == 1 ? w[r].y : i == 2 ? w[r].z : w[r].w;
      t[i][r] = fp4_at(word, 0) * x[i * 8];
#pragma unroll
      for (int j = 1; j < 8; ++j) t[i][r] += fp4_at(word, j) * x[i * 8 + j];
    }
  }
#pragma unroll
  for (int r = 0; r < MV_ROWS; ++r) d[r] = ((t[0][r] + t[1][r]) + t[2][r]) + t[3][r];
}

// Value k (0 .. 7) of an input slot (8 bfloat16 values) as a float.
__device__ __forceinline__ float slot_value(const uint4 t, int k) {
  const u32 w = k < 2 ? t.x : k < 4 ? t.y : k < 6 ? t.z : t.w;
  return (k & 1) ? hi2f(w) : lo2f(w);
}

// acc + (scale d + bias xsum): a chunk's codes' sum d scaled, its inputs' sum xsum biased.
// The rounding spelled out (bias xsum rounded, then one fma, then the add: what the compiler
// made of the plain expression for one sequence), so that the kernels of one and of several
// sequences, which the compiler schedules differently, round it alike.
__device__ __forceinline__ float scale_bias(float acc, float scale, float d, float bias,
                                            float xsum) {
#ifdef __CUDA_ARCH__
  return acc + __fmaf_rn(scale, d, __fmul_rn(bias, xsum));
#else
  return acc + (scale * d + bias * xsum);
#endif
}

// Weights are read once a step: loaded past L1.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
#ifdef __CUDA_ARCH__
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
#else
  return *p;
#endif
}

// A 16-byte copy from global to shared memory, past L1 and the registers (cp.async; the
// emulator copies at once).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#ifdef __CUDA_ARCH__
  const u32 d = (u32)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
#else
  *(uint4*)dst = *(const uint4*)src;
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#ifdef __CUDA_ARCH__
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}
// A 4-byte copy (through L1: cp.async.ca), the ring's commit group and its in-order wait for
// all but the newest n groups (MMA_ASYNC; the emulator copies at once).
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
#ifdef __CUDA_ARCH__
  const u32 d = (u32)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src) : "memory");
#else
  *(u32*)dst = *(const u32*)src;
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef __CUDA_ARCH__
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int n>
__device__ __forceinline__ void cp_async_wait_group() {
#ifdef __CUDA_ARCH__
  asm volatile("cp.async.wait_group %0;" ::"n"(n) : "memory");
#endif
}

// Chunks a lane keeps in flight for each of its MV_ROWS rows: 8 16-byte loads a lane (more
// would cost the second block an SM: ~120 registers a thread at 8).
#ifndef MV_BATCH
#define MV_BATCH (8 / MV_ROWS)
#endif
// Of those, how many are loaded before the wait for the previous kernel (the rest after the
// prologue, whose input reads would queue behind them).
#ifndef MV_EARLY
#define MV_EARLY MV_BATCH
#endif
// MV_EARLY_NORM (the host's switch MLX_GRAPH_EARLY_PROLOGUE=1; 0 otherwise): a normed
// product's norm weights (the model's, read from memory, usually past L2 by the time the
// step comes back to them) are loaded before the wait as well, so the prologue past the wait
// waits only for its input. The same values, summed the same way: the same bits.
#ifndef MV_EARLY_NORM
#define MV_EARLY_NORM 0
#endif

// MV_ASYNC (the host's switch MLX_GRAPH_MV_ASYNC=1; 0 otherwise): the FFMA row kernels'
// (mv_run's) scales and biases are kept as loaded, each 16-bit value zero-extended in a
// register of its own (the item's sb and bi), and read as floats only where the item is
// summed. Packed into one word at the load (ld_sb, MV_ASYNC 0), ptxas issues the pack (a PRMT)
// right after the loads, so each refill waits a memory latency for its own scale and bias
// and the items in flight no longer hide it (results/gpu/2026-12-06-s36-mmatile, section 5).
// Both ways read the same values and sum them in the same order: every output is MV_ASYNC 0's,
// bit for bit (graph_emulate.py's nb_bit_check; results/gpu/2026-12-06-s36-mvload).
#ifndef MV_ASYNC
#define MV_ASYNC 0
#endif

// MV_NB (the host's switch MLX_GRAPH_MV_NB=1; 0 otherwise): the FFMA tiles of several sequences
// (NB > 1: batched rows, speculation's verify rows) stream their items as the one-row kernel
// does, MV_BATCH a trip unrolled, item j in register slot j % MV_BATCH, each slot refilled once
// summed. Without it one item a trip from slot 0, the slots moved down one a trip (rotate): the
// moves read the slot loaded in the trip before, so every trip waits for its newest load (one
// memory round trip an item; results/gpu/2026-12-06-s39-verify). The same items, summed in
// the same order by the same code (compute): every output is the one without the switch, bit
// for bit.
#ifndef MV_NB
#define MV_NB 0
#endif
// MV_WIDE (the host's switch MLX_GRAPH_MV_WIDE=1; 0 otherwise): the FFMA tiles of several
// sequences (NB > 1 without MV_MMA: batched rows, speculation's verify rows) run matvec and
// matvec_qkv in blocks of 512 threads (16 warps over one copy of the inputs) at 128 registers a
// thread, for 4 warps a scheduler where 245 registers leave 2 (results/gpu/2026-12-06-s40-verify512).
// The host launches those two kernels with 512 threads and sets MV_BATCH 1 (one item in flight a
// lane: 16 warps hold as many bytes in flight a multiprocessor as 8 at 2). The warps stride over the row groups by the block's warps (a group is summed
// whole by one warp, its chunks in the same order); the prologue runs on the first 256 threads
// as in a block of 256 (the norm's sum of squares in the same order; the other warps wait at its
// barriers); qchunk_rows takes one sequence at a time within a word (each (sequence, row) chain
// in the same order). Every output is the one without the switch, bit for bit (graph_emulate.py
// with GRAPH_EMU_MV_WIDE=1).
#ifndef MV_WIDE
#define MV_WIDE 0
#endif
#define MV_WIDE_ON (MV_WIDE && NB > 1 && !MV_MMA)
#if MV_WIDE_ON
// matvec's and matvec_qkv's launch bounds: 512 threads, one block (128 registers a thread).
#define MV_BOUNDS 512, 1
#else
#define MV_BOUNDS 256, MV_MIN_BLOCKS
#endif
// The prologue's threads (a block of 256 for it) and whether this thread is one of them.
__device__ __forceinline__ int mv_pro_t() {
  return MV_WIDE_ON ? MV_WARPS * 32 : (int)blockDim.x;
}
__device__ __forceinline__ bool mv_pro_mine() {
  return !MV_WIDE_ON || (int)threadIdx.x < MV_WARPS * 32;
}
// Where a matrix's rows are: the loaded model's own arrays as MLX holds them (issue #30: no
// copy), one to three parts, each with its words (rows of K bfloat16 values or K BITS-bit
// codes) and, quantized, its bfloat16 scales and biases ([rows, K / gs] each, MLX's layout).
// map says which part and row of it the kernel's row r is (wrow):
// WMAP_ONE: part 0's row r;
// WMAP_PAIR (gate/up): rows alternate, r even part 0's row r / 2, r odd part 1's;
// WMAP_QKV: q (part 0, rows [0, r1)), k (part 1, [r1, r2)), v (part 2, from r2); within q's and
//   k's heads of D rows, rows 2i and 2i + 1 (i < pairs) are the head's rows i and i + pairs (a
//   RoPE rotation pair side by side), the rest in order.
// A row group of MV_ROWS rows never straddles two parts or the paired rows' end (the host
// checks), so its rows are those of two bases, r even from the first, odd from the second,
// each advancing `step` rows every two (MvStream::group).
#define WMAP_ONE 0
#define WMAP_PAIR 1
#define WMAP_QKV 2
struct Wts {
  const unsigned char* w0;
  const unsigned char* w1;
  const unsigned char* w2;
  const bf16_t* s0;
  const bf16_t* s1;
  const bf16_t* s2;
  const bf16_t* b0;
  const bf16_t* b1;
  const bf16_t* b2;
  int map;
  ll r1, r2;
  int D, pairs;
  // Row r's part and row within it.
  __device__ __forceinline__ void wrow(ll r, int& part, ll& phys) const {
    if (map == WMAP_PAIR) {
      part = (int)(r & 1);
      phys = r >> 1;
    } else if (map == WMAP_QKV) {
      part = r < r1 ? 0 : r < r2 ? 1 : 2;
      ll j = r - (part == 0 ? 0 : part == 1 ? r1 : r2);
      if (part < 2 && pairs > 0) {
        const int i = (int)(j % D);
        if (i < 2 * pairs) j += (i >> 1) - i + (i & 1) * pairs;
      }
      phys = j;
    } else {
      part = 0;
      phys = r;
    }
  }
  __device__ __forceinline__ const unsigned char* words(int part) const {
    return part == 0 ? w0 : part == 1 ? w1 : w2;
  }
  __device__ __forceinline__ const bf16_t* scales(int part) const {
    return part == 0 ? s0 : part == 1 ? s1 : s2;
  }
  __device__ __forceinline__ const bf16_t* biases(int part) const {
    return part == 0 ? b0 : part == 1 ? b1 : b2;
  }
};

// The kernels' Wts from their parameters (W0, W1, W2, S0, S1, S2, B0, B1, B2; unused parts and,
// with bfloat16 weights, the scales and biases are any buffer: never read).
__device__ __forceinline__ Wts make_wts(const void* W0, const void* W1, const void* W2,
                                        const bf16_t* S0, const bf16_t* S1, const bf16_t* S2,
                                        const bf16_t* B0, const bf16_t* B1, const bf16_t* B2,
                                        int map, ll r1 = 0, ll r2 = 0, ll D = 1, ll pairs = 0) {
  Wts w;
  w.w0 = (const unsigned char*)W0;
  w.w1 = (const unsigned char*)W1;
  w.w2 = (const unsigned char*)W2;
  w.s0 = S0;
  w.s1 = S1;
  w.s2 = S2;
  w.b0 = B0;
  w.b1 = B1;
  w.b2 = B2;
  w.map = map;
  w.r1 = r1;
  w.r2 = r2;
  w.D = (int)D;
  w.pairs = (int)pairs;
  return w;
}

// Group g's (scale, bias) of a row as one word, scale in the low half (what the products use).
__device__ __forceinline__ u32 ld_sb(const bf16_t* s, const bf16_t* b, ll i) {
  return (u32)s[i] | ((u32)b[i] << 16);
}

// A warp's share of W x, W [N, K] (bfloat16, or BITS-bit codes with bfloat16 scales and
// biases), as one stream of 16-byte chunks: the warp takes row groups first, first + stride,
// ... (MV_ROWS rows each), lane l chunks l, l + 32, ... of each row (per_lane of them, the
// last ones past C skipped). MV_BATCH items are in flight; an item's slot is refilled with
// the item MV_BATCH ahead, across row groups, as soon as it has been used.
// MAP: the weights' Wts map (a template argument: each map keeps only the addresses it needs).
// FP4 (with BITS 4): mxfp4 codes, sb each group's halved e8m0 scale as float bits (mv_fp4_scale),
// the inputs unscaled.
template <int BITS, int MAP, bool FP4 = false>
struct MvStream {
  static constexpr int VALS = BITS == 16 ? 8 : 4 * (32 / BITS);  // inputs a chunk
  Wts wt;
  ll N, groups, stride;
  int row_bytes, C, G, gs_shift, per_lane, lane;
  uint4 q[MV_BATCH][MV_ROWS];
  // A row's group's scale and bias: one word, scale in the low half (ld_sb); with MV_ASYNC, the
  // scale alone in sb's low half and the bias in bi's (mxfp4: sb the scale, bi unused).
  u32 sb[MV_BATCH][MV_ROWS];
#if MV_ASYNC
  u32 bi[MV_BATCH][MV_ROWS];
#endif
  ll lp;  // the next item to load: row group lp, chunk lane + 32 lk
  int lk;
  // Row group lp's rows (Wts): row r is row a + r of part 0 (WMAP_ONE); row a + (r >> 1) of
  // part r & 1 (WMAP_PAIR); of its part (WMAP_QKV), row a + (r >> 1) step for r even, row
  // b + (r >> 1) step for r odd. wg: row a's words (in part 0, or the group's part), wg1: the
  // odd rows' first (WMAP_PAIR: row a in part 1; WMAP_QKV: row b); ia, ib: their groups'
  // index (a G, b G); sp, bp: the group's part's scales and biases (WMAP_QKV); stepb, stepg:
  // step rows in bytes and in groups. Rows past its first that exist: last (less than
  // MV_ROWS - 1 only in a last group; the missing ones repeat the last).
  const unsigned char* wg;
  const unsigned char* wg1;
  const bf16_t* sp;
  const bf16_t* bp;
  int ia, ib, stepb, stepg;
  int last;
  // Experts (graph_moe.cu; null elsewhere): the rows are `rpe` a slot, slot j's rows those of
  // expert sel[j] in the stacked weights (a row group never straddles two slots).
  const int* sel;
  ll rpe;
  __device__ __forceinline__ void group() {
    const ll row0 = MV_ROWS * lp;
    ll prow = row0;
    if (sel && lp < groups) {
      const ll j = row0 / rpe;
      prow = (ll)sel[j] * rpe + (row0 - j * rpe);
    }
    ll a;
    if (MAP == WMAP_QKV) {
      // wrow once: a group's rows are pairs (rows i, i + pairs) or in order throughout.
      int pt;
      wt.wrow(prow, pt, a);
      const ll j = prow - (pt == 0 ? 0 : pt == 1 ? wt.r1 : wt.r2);
      const bool paired = pt < 2 && (int)(j % wt.D) < 2 * wt.pairs;
      const ll b = paired ? a + wt.pairs : a + 1;
      const int step = paired ? 1 : 2;
      wg = wt.words(pt) + a * row_bytes;
      wg1 = wt.words(pt) + b * row_bytes;
      sp = wt.scales(pt);
      bp = wt.biases(pt);
      ib = (int)(b * G);
      stepb = step * row_bytes;
      stepg = step * G;
    } else {
      a = MAP == WMAP_PAIR ? prow >> 1 : prow;
      wg = wt.w0 + a * row_bytes;
      if (MAP == WMAP_PAIR) wg1 = wt.w1 + a * row_bytes;
    }
    ia = (int)(a * G);
    last = N - 1 - row0 < MV_ROWS - 1 ? (int)(N - 1 - row0) : MV_ROWS - 1;
  }

  // Row rr's words, and its group g's scale and bias (rr a constant once unrolled).
  __device__ __forceinline__ const unsigned char* words(int rr) const {
    if (MAP == WMAP_ONE) return wg + rr * row_bytes;
    if (MAP == WMAP_PAIR) return (rr & 1 ? wg1 : wg) + (rr >> 1) * row_bytes;
    return (rr & 1 ? wg1 : wg) + (rr >> 1) * stepb;
  }
  __device__ __forceinline__ u32 scale_bias(int rr, int g) const {
    if (MAP == WMAP_ONE) return ld_sb(wt.s0, wt.b0, ia + rr * G + g);
    if (MAP == WMAP_PAIR) {
      const int i = ia + (rr >> 1) * G + g;
      return rr & 1 ? ld_sb(wt.s1, wt.b1, i) : ld_sb(wt.s0, wt.b0, i);
    }
    return ld_sb(sp, bp, (rr & 1 ? ib : ia) + (rr >> 1) * stepg + g);
  }
  // Row rr's group g: its scales' and biases' arrays and its index in both (the places
  // scale_bias reads; MV_ASYNC's reads take them from here).
  __device__ __forceinline__ int sb_at(int rr, int g, const bf16_t*& ps,
                                       const bf16_t*& pb) const {
    if (MAP == WMAP_ONE) {
      ps = wt.s0;
      pb = wt.b0;
      return ia + rr * G + g;
    }
    if (MAP == WMAP_PAIR) {
      ps = rr & 1 ? wt.s1 : wt.s0;
      pb = rr & 1 ? wt.b1 : wt.b0;
      return ia + (rr >> 1) * G + g;
    }
    ps = sp;
    pb = bp;
    return (rr & 1 ? ib : ia) + (rr >> 1) * stepg + g;
  }
  // MV_ASYNC: the same group's scale into s and bias into b, each as loaded (zero-extended).
  __device__ __forceinline__ void scale_bias_raw(int rr, int g, u32& s, u32& b) const {
    const bf16_t* ps;
    const bf16_t* pb;
    const int i = sb_at(rr, g, ps, pb);
    s = ps[i];
    b = pb[i];
  }
  // Slot u's row r's scale and bias as floats (where the item is summed).
  __device__ __forceinline__ float scale_f(int u, int r) const { return lo2f(sb[u][r]); }
  __device__ __forceinline__ float bias_f(int u, int r) const {
#if MV_ASYNC
    return lo2f(bi[u][r]);
#else
    return hi2f(sb[u][r]);
#endif
  }
  // mxfp4: row rr's group g's scale (a byte in the part's scales), halved, as float bits.
  __device__ __forceinline__ u32 scale_fp4(int rr, int g) const {
    const unsigned char* s0 = (const unsigned char*)wt.s0;
    if (MAP == WMAP_PAIR) {
      const int i = ia + (rr >> 1) * G + g;
      return mv_fp4_scale(rr & 1 ? ((const unsigned char*)wt.s1)[i] : s0[i]);
    }
    return mv_fp4_scale(s0[ia + rr * G + g]);
  }

  __device__ __forceinline__ void load(int u) {
    const int c = lane + 32 * lk;
    if (lp < groups && c < C) {
      const int g = (c * VALS) >> gs_shift;
#pragma unroll
      for (int r = 0; r < MV_ROWS; ++r) {
        const int rr = r < last ? r : last;
        q[u][r] = ld_stream((const uint4*)words(rr) + c);
#if MV_ASYNC
        if (BITS != 16 && FP4) sb[u][r] = scale_fp4(rr, g);
        if (BITS != 16 && !FP4) scale_bias_raw(rr, g, sb[u][r], bi[u][r]);
#else
        if (BITS != 16) sb[u][r] = FP4 ? scale_fp4(rr, g) : scale_bias(rr, g);
#endif
      }
    }
    if (++lk == per_lane) {
      lk = 0;
      lp += stride;
      group();
    }
  }

  // Slot u takes slot u + 1's item (the last slot keeps its own until loaded again).
  __device__ __forceinline__ void rotate() {
#pragma unroll
    for (int u = 0; u + 1 < MV_BATCH; ++u) {
#pragma unroll
      for (int r = 0; r < MV_ROWS; ++r) {
        q[u][r] = q[u + 1][r];
        sb[u][r] = sb[u + 1][r];
#if MV_ASYNC
        bi[u][r] = bi[u + 1][r];
#endif
      }
    }
  }

  // acc[b][r] += row r . x_b over chunk c, from slot u, for each sequence b (its input at
  // xs + b xstride bytes, its chunk sums at xc + b xstride bytes).
  // The row group's input starts co chunks into xs and xc (per-slot inputs; 0 otherwise).
  __device__ __forceinline__ void compute(int u, int c, int co, const bf16_t* xs,
                                          const float* xc, int xstride, float (*acc)[MV_ROWS]) {
    if (c >= C) return;
    c += co;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const bf16_t* xsb = (const bf16_t*)((const unsigned char*)xs + b * xstride);
      if (BITS == 16) {
        const uint4 xv = ((const uint4*)xsb)[xs_slot(c)];
#pragma unroll
        for (int r = 0; r < MV_ROWS; ++r) acc[b][r] = dot8(q[u][r], xv, acc[b][r]);
      } else if (FP4) {
        // mxfp4: the chunk is one group; its doubled sum times the halved scale (exact).
        float d[MV_ROWS];
        qchunk_fp4(q[u], xsb, c, d);
#pragma unroll
        for (int r = 0; r < MV_ROWS; ++r) acc[b][r] += __uint_as_float(sb[u][r]) * d[r];
      } else if (NB == 1) {
        float d[MV_ROWS];
        qchunk<BITS>(q[u], xsb, c, d);
        const float xsum = ((const float*)((const unsigned char*)xc + b * xstride))[c];
#pragma unroll
        for (int r = 0; r < MV_ROWS; ++r)
          acc[b][r] = ::scale_bias(acc[b][r], scale_f(u, r), d[r], bias_f(u, r), xsum);
      }
    }
    if (BITS != 16 && !FP4 && NB > 1) qchunk_rows(u, c, xs, xc, xstride, acc);
  }

  // compute's quantized case for NB > 1: the codes of each word are decoded once, for every
  // sequence. Each sum is the one qchunk forms (each word's codes summed on their own, the
  // words' sums in order, then scale and bias), bit for bit: only the loops are swapped.
  // Within a word the code index is the outer loop and the sequences and rows the inner
  // ones: NB x MV_ROWS independent chains of dependent adds side by side (one chain, one
  // (sequence, row), in qchunk's order), where a sequence at a time gave the scheduler
  // MV_ROWS (results/gpu/2026-12-05-s31-spec).
  __device__ __forceinline__ void qchunk_rows(int u, int c, const bf16_t* xs, const float* xc,
                                              int xstride, float (*acc)[MV_ROWS]) {
    constexpr int PER = 32 / BITS;
    constexpr int VALS = 4 * PER;
    float d[NB][MV_ROWS];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float q[MV_ROWS][PER];
#pragma unroll
      for (int r = 0; r < MV_ROWS; ++r) {
        const u32 word = i == 0 ? this->q[u][r].x
                         : i == 1 ? this->q[u][r].y
                         : i == 2 ? this->q[u][r].z
                                  : this->q[u][r].w;
        if (BITS == 4) {
          codes4(word, q[r]);
        } else {
          codes8(word, q[r]);
        }
      }
      // Word i's inputs: slot c (VALS / 8) + i PER / 8, from its (i PER % 8)-th value.
      const int slot = xs_slot(c * (VALS / 8) + (i * PER) / 8);
      const int off = (i * PER) % 8;
#if MV_WIDE_ON
      // MV_WIDE (128 registers): one sequence's inputs at a time, its MV_ROWS chains summed in
      // the order below (each chain's adds as qchunk's), then the next sequence's.
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const uint4 tb = ((const uint4*)((const unsigned char*)xs + b * xstride))[slot];
        float sr[MV_ROWS];
#pragma unroll
        for (int j = 0; j < PER; ++j) {
          const float x = slot_value(tb, off + j);
#pragma unroll
          for (int r = 0; r < MV_ROWS; ++r) sr[r] = j == 0 ? q[r][0] * x : sr[r] + q[r][j] * x;
        }
#pragma unroll
        for (int r = 0; r < MV_ROWS; ++r) d[b][r] = i == 0 ? sr[r] : d[b][r] + sr[r];
      }
#else
      uint4 t[NB];
#pragma unroll
      for (int b = 0; b < NB; ++b)
        t[b] = ((const uint4*)((const unsigned char*)xs + b * xstride))[slot];
      float s[NB][MV_ROWS];
#pragma unroll
      for (int j = 0; j < PER; ++j) {
#pragma unroll
        for (int b = 0; b < NB; ++b) {
          const float x = slot_value(t[b], off + j);
#pragma unroll
          for (int r = 0; r < MV_ROWS; ++r) {
            if (j == 0) {
              s[b][r] = q[r][0] * x;
            } else {
              s[b][r] += q[r][j] * x;
            }
          }
        }
      }
#pragma unroll
      for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int r = 0; r < MV_ROWS; ++r) d[b][r] = i == 0 ? s[b][r] : d[b][r] + s[b][r];
#endif
    }
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const float xsum = ((const float*)((const unsigned char*)xc + b * xstride))[c];
#pragma unroll
      for (int r = 0; r < MV_ROWS; ++r)
        acc[b][r] = ::scale_bias(acc[b][r], scale_f(u, r), d[b][r], bias_f(u, r), xsum);
    }
  }
};

// 16-byte pieces (8 inputs) a thread loads at once in the prologue: the input and the norm's
// weights (PRO_PIECES each), or the input alone (2 PRO_PIECES).
#define PRO_PIECES 4

__device__ __forceinline__ float sum8(uint4 v) {
  return lo2f(v.x) + hi2f(v.x) + lo2f(v.y) + hi2f(v.y) + lo2f(v.z) + hi2f(v.z) + lo2f(v.w) +
         hi2f(v.w);
}
__device__ __forceinline__ float sq8(uint4 v) {
  float a = 0.f;
  const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    a += lo2f(w[i]) * lo2f(w[i]);
    a += hi2f(w[i]) * hi2f(w[i]);
  }
  return a;
}
// Two inputs x normed by inv and weighted by g, rounded as MLX's fast.rms_norm rounds them.
__device__ __forceinline__ u32 norm2(u32 x, u32 g, float inv) {
  const bf16_t lo = f2bf(lo2f(g) * rbf(lo2f(x) * inv));
  const bf16_t hi = f2bf(hi2f(g) * rbf(hi2f(x) * inv));
  return (u32)lo | ((u32)hi << 16);
}

// Stores piece t of the input (o, normed if it is to be) into xs, scaled for the codes
// (xs_scale), and with quantized weights the sums of its chunks into xc. Called for every
// t = i T + tid of a round by every thread (t past the pieces stores nothing), so that the
// lane sums see whole warps: the slots a chunk of codes covers, 4 (4-bit) or 2 (8-bit), sit
// in neighbouring lanes.
// raw: the inputs stored as they are (the tensor-core tiles, mv_run_mma), not scaled.
__device__ __forceinline__ void mv_store_piece(bf16_t* xs, float* xc, int t, int pieces, uint4 o,
                                               ll bits, bool raw) {
  const int spc = bits == 16 ? 0 : (int)(16 / bits);
  float sum = 0.f;
  if (t < pieces) {
    ((uint4*)xs)[xs_slot(t)] = raw ? o : xs_scale(o, bits);
    if (spc) sum = sum8(o);
  }
  if (spc) {
    for (int m = 1; m < spc; m <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
    if (t < pieces && (t & (spc - 1)) == 0) xc[t / spc] = sum;
  }
}

__device__ __forceinline__ uint4 norm8(uint4 v, uint4 g, float inv) {
  v.x = norm2(v.x, g.x, inv);
  v.y = norm2(v.y, g.y, inv);
  v.z = norm2(v.z, g.z, inv);
  v.w = norm2(v.w, g.w, inv);
  return v;
}

// Loads this thread's pieces of the prologue's round rd (piece (rd P + i) T + tid of the input
// into v[i], and with NORM of the norm's weights into g[i]; those past the end left alone).
template <int P, bool NORM>
__device__ __forceinline__ void mv_load_pieces(uint4* v, uint4* g, const uint4* xv,
                                               const uint4* gv, int rd, int pieces) {
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int t = (rd * P + i) * mv_pro_t() + (int)threadIdx.x;
    if (t < pieces && mv_pro_mine()) {
      v[i] = xv[t];
      if (NORM) g[i] = gv[t];
    }
#if defined(PS_LOOP) && PS_LOOP
    else {
      v[i] = uint4{};  // PS_ZERO's reason (the layer loop)
      if (NORM) g[i] = uint4{};
    }
#endif
  }
}

// Adds the squares of this thread's pieces of round rd to ss.
template <int P>
__device__ __forceinline__ void mv_add_squares(float& ss, const uint4* v, int rd, int pieces) {
#pragma unroll
  for (int i = 0; i < P; ++i) {
    if ((rd * P + i) * mv_pro_t() + (int)threadIdx.x < pieces && mv_pro_mine()) ss += sq8(v[i]);
  }
}

// 1 / rms of the input from each thread's sum of squares (a block reduction).
__device__ __forceinline__ float mv_inv_rms(float ss, float* red, ll K, double eps) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  ss = warp_sum(ss);
  if (lane == 0 && mv_pro_mine()) red[warp] = ss;
  __syncthreads();
  float tot = 0.f;
  for (int i = 0; i < MV_WARPS; ++i) tot += red[i];
  return rsqrtf(tot / (float)K + (float)eps);
}

// Stores this thread's pieces of round rd, normed (mv_store_piece).
template <int P>
__device__ __forceinline__ void mv_store_normed(bf16_t* xs, float* xc, const uint4* v,
                                                const uint4* g, float inv, int rd, int pieces,
                                                ll bits, bool raw) {
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int t = mv_pro_mine() ? (rd * P + i) * mv_pro_t() + (int)threadIdx.x : pieces;
    mv_store_piece(xs, xc, t, pieces, t < pieces ? norm8(v[i], g[i], inv) : v[i], bits, raw);
  }
}

// Fills xs (shared, slots swizzled) with the input vector: xin, or rms_norm(xin, normw, eps)
// rounded as MLX's fast.rms_norm rounds it, scaled for the codes (xs_scale); with quantized
// weights (bits 4 or 8) also xc[c], the sum of chunk c's inputs (128 / bits of them, what a
// 16-byte chunk of codes covers), shared by every row. All threads of the block take part,
// each loading its 16-byte pieces (one slot of xs each; K is a multiple of 8) at once: one
// round trip to L2 when they fit (K up to 8,192 normed, 16,384 not), rounds of them beyond.
// g_pre: gpre holds the norm's weights of this thread's pieces, loaded already (mv_run with
// MV_EARLY_NORM, before the wait: the same values, so the same bits).
__device__ __forceinline__ void mv_prologue(bf16_t* xs, float* xc, float* red, const bf16_t* xin,
                                            const bf16_t* normw, ll K, bool norm, double eps,
                                            ll bits, bool raw = false,
                                            const uint4* gpre = nullptr, bool g_pre = false) {
  const int tid = threadIdx.x;
  const int T = mv_pro_t(), pieces = (int)(K / 8);
  const uint4* xv = (const uint4*)xin;
  const uint4* gv = (const uint4*)normw;
  if (norm && pieces <= T * PRO_PIECES) {
    // The input and the weights at once, kept in registers across the reduction.
    uint4 v[PRO_PIECES], g[PRO_PIECES];
    float ss = 0.f;
    if (g_pre) {
      mv_load_pieces<PRO_PIECES, false>(v, v, xv, gv, 0, pieces);
#pragma unroll
      for (int i = 0; i < PRO_PIECES; ++i) g[i] = gpre[i];
    } else {
      mv_load_pieces<PRO_PIECES, true>(v, g, xv, gv, 0, pieces);
    }
    mv_add_squares<PRO_PIECES>(ss, v, 0, pieces);
    const float inv = mv_inv_rms(ss, red, K, eps);
    mv_store_normed<PRO_PIECES>(xs, xc, v, g, inv, 0, pieces, bits, raw);
  } else if (norm) {
    // A long input: its sum of squares, then it and the weights again (from L2), in rounds.
    const int rounds = (pieces + T * PRO_PIECES - 1) / (T * PRO_PIECES);
    float ss = 0.f;
    for (int rd = 0; rd < rounds; ++rd) {
      uint4 v[PRO_PIECES];
      mv_load_pieces<PRO_PIECES, false>(v, v, xv, gv, rd, pieces);
      mv_add_squares<PRO_PIECES>(ss, v, rd, pieces);
    }
    const float inv = mv_inv_rms(ss, red, K, eps);
    for (int rd = 0; rd < rounds; ++rd) {
      uint4 v[PRO_PIECES], g[PRO_PIECES];
      mv_load_pieces<PRO_PIECES, true>(v, g, xv, gv, rd, pieces);
      mv_store_normed<PRO_PIECES>(xs, xc, v, g, inv, rd, pieces, bits, raw);
    }
  } else {
    constexpr int P = 2 * PRO_PIECES;
    const int rounds = (pieces + T * P - 1) / (T * P);
    for (int rd = 0; rd < rounds; ++rd) {
      uint4 v[P];
      mv_load_pieces<P, false>(v, v, xv, gv, rd, pieces);
#pragma unroll
      for (int i = 0; i < P; ++i) {
        mv_store_piece(xs, xc, mv_pro_mine() ? (rd * P + i) * T + tid : pieces, pieces, v[i],
                       bits, raw);
      }
    }
  }
  __syncthreads();
}

// The attention's partial outputs for an output projection that combines them itself
// (matvec_attn_out): po and pml as attention writes them (sequence b's at b nh NS D and
// b nh NS 2), the step state (each sequence's position), nh heads, NS chunks a head.
struct AttnParts {
  const float* po;
  const float* pml;
  const int* state;
  ll nh, NS;
};

// Chunks of every head's partial outputs the output projection's blocks stage at once in
// shared memory (mv_prologue_attn): a prompt of up to ATTN_OUT_CHUNKS * ATTN_CHUNK positions
// in one round trip to L2. (ATTN_OUT_CHUNKS and the stage's layout: `attn_out_shared_bytes`
// in graph_decode.rs.)
#define ATTN_OUT_CHUNKS 12

// mv_prologue for the output projection of sequence b's attention (matvec_attn_out): xs (and
// xc) filled with the attention's output, combined from its chunks' partials exactly as
// attention's combining block combines them, so the same bits: per tile of ATTN_THREADS
// chunks the maximum Mn, keep = e^(M - Mn) (0 on the first), each chunk's weight
// w_t = e^(m_t - Mn) (0 for m_t = -inf), the tile's sum of l_t w_t as attention's warps add it
// (a butterfly over each warp's 32 chunks, those past ns adding 0, then the warps in order),
// den = den keep + tile, num = num keep, then num += o_t w_t over the tile's chunks in order;
// f2bf(num / den). Thread t < K / 8 takes dimensions 8 t .. 8 t + 7 (one head's; the host
// keeps K / 8 <= T). All threads stage the partials in shared memory past the inputs (16-byte
// loads past L1, after the wait, issued together): ATTN_OUT_CHUNKS chunks of every head's
// outputs a round, then the tile's (m, l) pairs of every head. An idle sequence (position -1)
// gets zeros.
__device__ __forceinline__ void mv_prologue_attn(bf16_t* xs, float* xc, float* stage,
                                                 const AttnParts& ap, int b, ll K, ll bits) {
  const int T = blockDim.x, tid = threadIdx.x, pieces = (int)(K / 8);
  const ll nh = ap.nh, NS = ap.NS, D = K / nh, dg = D / 8;
  const ll TC = NS < ATTN_THREADS ? NS : ATTN_THREADS;
  float* spo = stage;                      // [nh][ATTN_OUT_CHUNKS][D]
  float* sml = stage + K * ATTN_OUT_CHUNKS;  // [nh][TC][2]
  const int pos = ap.state[4 * b + 1];
  const ll L = pos < 0 ? 0 : (ll)pos + 1;
  const ll ns = (L + ATTN_CHUNK - 1) / ATTN_CHUNK;
  const float* po = ap.po + b * nh * NS * D;
  const float* pml = ap.pml + b * nh * NS * 2;
  const bool mine = tid < pieces;
  const ll h = mine ? tid / dg : 0, d0 = mine ? 8 * (tid % dg) : 0;
  float M = NEG_INF, Mn = NEG_INF, den = 0.f;
  float num[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) num[k] = 0.f;
  for (ll t0 = 0; t0 < ns; t0 += ATTN_THREADS) {
    const int nt = (int)(ns - t0 < ATTN_THREADS ? ns - t0 : ATTN_THREADS);
    for (int c0 = 0; c0 < nt; c0 += ATTN_OUT_CHUNKS) {
      const int nc = nt - c0 < ATTN_OUT_CHUNKS ? nt - c0 : ATTN_OUT_CHUNKS;
      __syncthreads();  // the stage's previous round has been read
      // The round's outputs: a head's nc chunks are nc D floats in a row in po; item i of
      // head hh is its float4 r (thread tid's items tid, tid + T, ... over the heads in turn).
      const int per_h = nc * (int)(D / 4), items = (int)nh * per_h;
      const float* src = po + (int)(t0 + c0) * (int)D;
      int hh = tid / per_h, r = tid - hh * per_h;
      // In a tile's first round, its (m, l) pairs: nt pairs of each head in a row in pml (the
      // thread's first two loaded with the outputs, any more after).
      const int mls = c0 == 0 ? (int)nh * nt : 0;
      auto ml_at = [&](int i, int& at) {
        const int g = i / nt, j = i - g * nt;
        at = g * (int)TC + j;
        return __ldcg((const float2*)(pml + (g * NS + t0 + j) * 2));
      };
      float2 ml[2];
      int ml_to[2] = {-1, -1};
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        if (tid + u * T < mls) ml[u] = ml_at(tid + u * T, ml_to[u]);
      }
      for (int i0 = 0; i0 < items; i0 += 8 * T) {
        float4 v[8];
        int dst[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          dst[u] = -1;
          if (hh < nh) {
            v[u] = __ldcg((const float4*)(src + hh * (int)(NS * D)) + r);
            dst[u] = hh * ATTN_OUT_CHUNKS * (int)(D / 4) + r;
            r += T;
            while (r >= per_h) {
              r -= per_h;
              ++hh;
            }
          }
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          if (dst[u] >= 0) ((float4*)spo)[dst[u]] = v[u];
        }
      }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        if (ml_to[u] >= 0) ((float2*)sml)[ml_to[u]] = ml[u];
      }
      for (int i = tid + 2 * T; i < mls; i += T) {
        int at;
        const float2 v = ml_at(i, at);
        ((float2*)sml)[at] = v;
      }
      __syncthreads();
      if (!mine) continue;
      const float* mh = sml + h * TC * 2;
      if (c0 == 0) {
        Mn = M;
        for (int j = 0; j < nt; ++j) Mn = fmaxf(Mn, mh[2 * j]);
        const float keep = M == NEG_INF ? 0.f : expf(M - Mn);
#pragma unroll
        for (int k = 0; k < 8; ++k) num[k] *= keep;
        float tile = 0.f;
        for (int w = 0; w * 32 < nt; ++w) {
          // Chunk j's l_j w_j (0 past nt, as attention's lanes past ns have it), rounded
          // before the sums as there (no multiply-add: __fmul_rn is never contracted).
          auto lw = [&](int j) {
            if (j >= nt) return 0.f;
            const float mt = mh[2 * j];
            const float wt = mt != NEG_INF ? expf(mt - Mn) : 0.f;
            return __fmul_rn(mh[2 * j + 1], wt);
          };
          // Lane 0's butterfly (warp_sum): at each stage lane i adds lane i + o's value.
          float s[16];
#pragma unroll
          for (int i = 0; i < 16; ++i) s[i] = lw(32 * w + i) + lw(32 * w + i + 16);
#pragma unroll
          for (int i = 0; i < 8; ++i) s[i] += s[i + 8];
#pragma unroll
          for (int i = 0; i < 4; ++i) s[i] += s[i + 4];
          s[0] += s[2];
          s[1] += s[3];
          tile += s[0] + s[1];
        }
        den = den * keep + tile;
      }
      for (int j = 0; j < nc; ++j) {
        const float mt = mh[2 * (c0 + j)];
        const float wt = mt != NEG_INF ? expf(mt - Mn) : 0.f;
        const float* o = spo + (h * ATTN_OUT_CHUNKS + j) * D + d0;
#pragma unroll
        for (int k = 0; k < 8; ++k) num[k] += o[k] * wt;
      }
    }
    M = Mn;
  }
  uint4 r = {0u, 0u, 0u, 0u};
  if (mine && ns > 0) {
    r.x = (u32)f2bf(num[0] / den) | ((u32)f2bf(num[1] / den) << 16);
    r.y = (u32)f2bf(num[2] / den) | ((u32)f2bf(num[3] / den) << 16);
    r.z = (u32)f2bf(num[4] / den) | ((u32)f2bf(num[5] / den) << 16);
    r.w = (u32)f2bf(num[6] / den) | ((u32)f2bf(num[7] / den) << 16);
  }
  mv_store_piece(xs, xc, tid, pieces, r, bits, false);
  __syncthreads();
}

// The chunk sums sit past xs, whose slots are swizzled within 64-byte groups: xs takes K
// rounded up to 64 values (`mv_shared_bytes` in graph_decode.rs).
__device__ __forceinline__ float* mv_chunk_sums(unsigned char* smem, ll K) {
  return (float*)(smem + 2 * ((K + 63) & ~63ll));
}

// Bytes of shared memory one sequence's input and chunk sums take (mv_shared_bytes in
// graph_decode.rs), rounded up to 16: sequence b's sit at smem + b mv_row_bytes.
__device__ __forceinline__ int mv_row_bytes(ll K, ll bits) {
  const ll sums = bits == 16 ? 0 : K / (128 / bits) * 4;
  return (int)((2 * ((K + 63) & ~63ll) + sums + 15) & ~15ll);
}

// Tensor-core tiles (MV_MMA, a tile of MMA_MIN_SEQUENCES sequences or more; 4-bit weights in
// groups of 64; xtask/gpu/mma_layout.py checks the layout): a block takes 16 rows at a time,
// its warps the groups of 64 inputs j = warp, warp + 8, ...; lane 4 g + t reads the 8 bytes
// (16 codes) of rows g and g + 8 at inputs 64 j + 16 t in place, and multiplies them with
// sequence g's same inputs by four mma.sync m16n8k16 (bfloat16 codes and inputs, float32
// sums; sequences past NB are zero columns). After a group, its sums of rows g, g + 8 and
// sequences 2 t, 2 t + 1 are scaled and biased: acc += scale D + bias (the group's input sum).
// The warps' sums are added in warp order in shared memory, and the epilogue runs on one
// thread a (row group, sequence). Tier: L3 against the single-row kernels (the tensor cores'
// sums are in their own order), within TEACHER_FORCED_BOUNDS (graph_decode.rs).
// MMA_ASYNC (the host's switch MLX_GRAPH_MMA_ASYNC=1, wide tiles only; 0 otherwise): each
// warp's weights and scale/bias words go through a ring of MMA_BATCH slots in shared memory
// by cp.async, one commit group an item, and an item waits for its own group only
// (cp.async.wait_group MMA_BATCH - 1, in order). The register loads' way (MMA_ASYNC 0) waits,
// in sm_90's SASS, for every weight load in flight at each item (one scoreboard for all 8
// items' loads) and for the item's scale/bias loads right after issuing them (they are packed
// at once): one memory latency an item and warp
// (results/gpu/2026-12-06-s36-mmatile). The products' arithmetic and order are the same:
// every output is the MMA_ASYNC 0 tile's, bit for bit (graph_emulate.py's mma_bit_check).
#ifndef MMA_ASYNC
#define MMA_ASYNC 0
#endif
#if MMA_ASYNC
// 6 slots of 640 bytes a warp (30 KiB a block, in static shared memory under 48 KiB with
// the partial sums): 5 items in flight a warp while one is summed.
#define MMA_BATCH 6
#define MMA_SLOT 640
#else
#define MMA_BATCH 8
#endif

// 8 bytes of codes, past L1.
__device__ __forceinline__ uint2 ld_stream2(const unsigned char* p) {
#ifdef __CUDA_ARCH__
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];"
               : "=r"(v.x), "=r"(v.y)
               : "l"(p));
  return v;
#else
  return *(const uint2*)p;
#endif
}

// Codes 0 and 1 of h (bits 0-3, 4-7) as a bfloat16 pair, exactly: 0x4300 | q is 128 + q in
// bfloat16, less 128 in one packed fma.
__device__ __forceinline__ u32 codes_bf2(u32 h) {
  const u32 v = (h & 0xFu) | ((h & 0xF0u) << 12) | 0x43004300u;
#ifdef __CUDA_ARCH__
  u32 d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(v), "r"(0x3F803F80u), "r"(0xC300C300u));
  return d;
#else
  return (u32)f2bf((float)(v & 0xFu)) | ((u32)f2bf((float)((v >> 16) & 0xFu)) << 16);
#endif
}

// d += A B, mma.sync m16n8k16 with the PTX ISA's fragments (lane 4 g + t):
// a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9],
// a[3] = A[g+8][2t+8, 2t+9]; b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g];
// d = D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]. (graph_emulate.py runs it on the CPU.)
__device__ __forceinline__ void mma16816(float* d, const u32* a, const u32* b) {
#ifdef __CUDA_ARCH__
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  mma_emulate(d, a, b);
#endif
}

// Sequences' column tiles of the tensor-core tiles: mma.sync's N is 8 sequences, so a tile of
// 9-16 multiplies each item's decoded codes (A, decoded once) with two B fragments (sequences
// 0-7 and 8-15), two independent chains of four mma.sync an item.
#define MMA_NT ((NB + 7) / 8)
// Inputs (a multiple of 64 MV_WARPS) a tensor-core tile stages at once in shared memory: set
// by the host where the tile's NB inputs of the widest product pass what a block may take
// (graph_decode.rs's `mma_chunk`: 16 inputs of the 8B's down projection, K 14,336, are 476 KB);
// 0: all of K. A product of a wider K runs its K in chunks: the block's warps over one chunk
// at a time, every rows block of a batch (up to MMA_RB) summed over it with the partial sums
// carried in registers, then the next chunk staged. Each warp still takes its groups
// j = warp, warp + 8, ... in order, so the sums are the unchunked kernel's, bit for bit.
#ifndef MMA_KC
#define MMA_KC 0
#endif
// Rows blocks of 16 a block carries partial sums for across the chunks of K (its rows blocks
// beyond restage the chunks: the host sizes the grid so that there are none at 8B).
#define MMA_RB 2
// MMA_BANKS (the host's switch MLX_GRAPH_MMA_BANKS=1, wide tiles only; 0 otherwise): where the
// staged inputs sit, so that an item's shared-memory reads fall in distinct banks. A sequence's
// staged input is 17 K / 8 bytes, a multiple of 128 at K 4,096 and chunks of 5,120: every
// sequence's piece p then sits in the same banks, and an item's B fragments (lanes g, g + 1 of a
// quarter-warp: sequences g, g + 1, the same pieces) take two passes where one would do, its
// chunk sums (4 sequences 2 apart, the same index) four. With MMA_BANKS, odd sequences' pieces
// swap within pairs of slots (slot ^ 1), and sequence b's chunk sums within groups of 8
// (index ^ 2 ((b >> 1) & 3), where KC is a multiple of 256 so that the groups are whole); the
// warps' partial sums are 4 MMA_NT + 1 floats a lane apart (the epilogue's reads of 8 row
// groups at once: 8 passes, then one). Only addresses move: every value read and every sum's
// order are MMA_BANKS 0's, so every output is its bit for bit (graph_emulate.py's mma_bit_check).
#ifndef MMA_BANKS
#define MMA_BANKS 0
#endif
// Sequence b's slot of staged piece p (xs_slot's, odd sequences' swapped in pairs with MMA_BANKS).
__device__ __forceinline__ int mma_slot(int p, int b) {
  return xs_slot(p) ^ (MMA_BANKS ? (b & 1) : 0);
}
// What sequence b's chunk sum indices are XORed with (even: a sum's pair stays in order).
__device__ __forceinline__ int mma_sum_x(int b, int KC) {
  return MMA_BANKS && (KC & 255) == 0 ? 2 * ((b >> 1) & 3) : 0;
}

// A path the host never launches (a trap on the device; the emulator stops).
__device__ __forceinline__ void mv_unreachable() {
#ifdef __CUDA_ARCH__
  asm volatile("trap;");
#else
  __builtin_trap();
#endif
}

// The tensor-core tiles' prologue, in three steps (mv_prologue's bits, all sequences' loads in
// flight at once instead of a round trip a sequence). mma_copy: pieces p0 .. p0 + n (8 inputs
// each) of every sequence's input straight into its slots (sequence b's at smem + b xstride,
// swizzled as xs_slot), all issued before one wait.
__device__ __forceinline__ void mma_copy(unsigned char* smem, int xstride, const bf16_t* xin,
                                         ll K, int p0, int n) {
  const uint4* xv = (const uint4*)xin;
  const ll KP = K >> 3;
  const int total = NB * n;
  for (int i = threadIdx.x; i < total; i += blockDim.x) {
    const int b = i / n, tt = i - b * n;
    cp_async16((uint4*)(smem + b * xstride) + mma_slot(tt, b), xv + b * KP + p0 + tt);
  }
  cp_async_wait_all();
  __syncthreads();
}

// invs[b] from the warps' sums of squares redn[b][warp] (added in warp order), once every
// warp's are written: mma_inv_rms's last step.
__device__ __forceinline__ void mma_invs(float* invs, float (*redn)[MV_WARPS], ll K, double eps) {
  const int tid = threadIdx.x;
  __syncthreads();
  if (tid < NB) {
    float tot = 0.f;
    for (int i = 0; i < MV_WARPS; ++i) tot += redn[tid][i];
    invs[tid] = rsqrtf(tot / (float)K + (float)eps);
  }
  __syncthreads();
}

// invs[b] = 1 / rms of sequence b's whole input, the bits mv_prologue's mv_inv_rms gives
// (each thread's squares of pieces tid, tid + T, ... in order, then the warps' sums in warp
// order): from the staged slots where the whole input is staged, else from memory.
__device__ __forceinline__ void mma_inv_rms(float* invs, float (*redn)[MV_WARPS],
                                            const unsigned char* smem, int xstride,
                                            const bf16_t* xin, ll K, double eps, bool staged) {
  const int T = blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int pieces = (int)(K >> 3);
  for (int b = 0; b < NB; ++b) {
    float ss = 0.f;
    if (staged) {
      const uint4* xs = (const uint4*)(smem + b * xstride);
      for (int p = tid; p < pieces; p += T) ss += sq8(xs[mma_slot(p, b)]);
    } else {
      const uint4* xv = (const uint4*)(xin + b * K);
      for (int p = tid; p < pieces; p += T) ss += sq8(xv[p]);
    }
    ss = warp_sum(ss);
    if (lane == 0) redn[b][warp] = ss;
  }
  mma_invs(invs, redn, K, eps);
}

// The chunk sum of piece tt of sequence b (its 4 lanes' sums added as mv_store_piece adds
// them) at mv_chunk_sums(.., KC): mma_finish's and mma_finish_late's last step a piece.
__device__ __forceinline__ void mma_put_sum(unsigned char* smem, int xstride, int KC, int b,
                                            int tt, bool ok, float sum) {
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  if (ok && (tt & 3) == 0)
    mv_chunk_sums(smem + b * xstride, KC)[(tt >> 2) ^ mma_sum_x(b, KC)] = sum;
}

// The staged pieces p0 .. p0 + n normed in place (with norm: by invs[b] and the norm's weights
// at those pieces) and their chunk sums (one a 32 inputs, the 4 lanes of a chunk added as
// mv_store_piece adds them) at mv_chunk_sums(.., KC). Thread tid takes pieces tid, tid + T, ...
// of every sequence (the norm's weights loaded once for all).
__device__ __forceinline__ void mma_finish(unsigned char* smem, int xstride, int KC,
                                           const bf16_t* normw, const float* invs, int p0, int n,
                                           bool norm) {
  const int T = blockDim.x, tid = threadIdx.x;
  const uint4* gv = (const uint4*)normw + p0;
  for (int m0 = 0; m0 < n; m0 += T) {
    const int tt = m0 + tid;
    const bool ok = tt < n;
    uint4 gw = {0u, 0u, 0u, 0u};
    if (ok && norm) gw = gv[tt];
    for (int b = 0; b < NB; ++b) {
      uint4* slot = (uint4*)(smem + b * xstride) + mma_slot(ok ? tt : 0, b);
      float sum = 0.f;
      if (ok) {
        uint4 o = *slot;
        if (norm) {
          o = norm8(o, gw, invs[b]);
          *slot = o;
        }
        sum = sum8(o);
      }
      mma_put_sum(smem, xstride, KC, b, tt, ok, sum);
    }
  }
  __syncthreads();
}

// MMA_LATE_NORM (on tensor-core tiles the host's level: 1 by default, MLX_GRAPH_MMA_LATE_NORM=0
// or 2 otherwise), in the kernels whose mv_run takes LATE: matvec_qkv from level 1, and at
// level 2 matvec_norm, matvec for the normed products (gate/up, the head) with LATE (in matvec
// itself it took the 8B's 16-row gate/up 7% faster, but changed matvec's whole machine code and
// its output and down projections ran 4-5% slower, results/gpu/2026-12-07-s48; matvec keeps
// its code). A normed product whose whole input is staged (one chunk of K) stages bf16(g x),
// the norm's weights times the raw input, with its chunk sums, and scales each sequence's sums
// by its 1 / rms at the epilogue: y = inv (W bf16(g x)) instead of W bf16(g bf16(inv x)). One
// pass over the staged inputs instead of two (mma_inv_rms's, then mma_finish's), the squares
// summed in the same pass in mma_inv_rms's partition and order (the same 1 / rms). The
// products' bits change (one rounding of each input instead of two, and the scale applied to
// the sums): tier L3 against the single-row kernels as the tiles already are, within
// TEACHER_FORCED_BOUNDS; every tile width takes it alike, so wide and narrow tiles stay
// bit-equal.
#ifndef MMA_LATE_NORM
#define MMA_LATE_NORM 0
#endif

// Eight inputs times the norm's weights, rounded to bfloat16 once (MMA_LATE_NORM).
__device__ __forceinline__ uint4 gmul8(uint4 v, uint4 g) {
  const u32 x[4] = {v.x, v.y, v.z, v.w}, w[4] = {g.x, g.y, g.z, g.w};
  u32 o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    o[i] = (u32)f2bf(lo2f(w[i]) * lo2f(x[i])) | ((u32)f2bf(hi2f(w[i]) * hi2f(x[i])) << 16);
  return uint4{o[0], o[1], o[2], o[3]};
}

// MMA_LATE_NORM's prologue of a normed product with all of K staged (mma_finish with p0 0 and
// n = K / 8): each staged piece weighted by the norm's weights in place, its chunk sums, and
// each sequence's squares of the raw pieces (thread tid's pieces tid, tid + T, ... in order,
// the warps' sums in warp order: mma_inv_rms's) into invs by mma_invs.
__device__ __forceinline__ void mma_finish_late(unsigned char* smem, int xstride, int KC,
                                                const bf16_t* normw, float* invs,
                                                float (*redn)[MV_WARPS], ll K, double eps) {
  const int T = blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n = (int)(K >> 3);
  const uint4* gv = (const uint4*)normw;
  // A sequence at a time (one sum of squares live; the norm's weights read again from L1 for
  // each), not unrolled: unrolled over 16 sequences, it took the 16-row matvec from 167 to 213
  // registers and its code from 13,984 to 31,728 instructions.
#pragma unroll 1
  for (int b = 0; b < NB; ++b) {
    float ss = 0.f;
    for (int m0 = 0; m0 < n; m0 += T) {
      const int tt = m0 + tid;
      const bool ok = tt < n;
      uint4* slot = (uint4*)(smem + b * xstride) + mma_slot(ok ? tt : 0, b);
      float sum = 0.f;
      if (ok) {
        uint4 o = *slot;
        ss += sq8(o);
        o = gmul8(o, gv[tt]);
        *slot = o;
        sum = sum8(o);
      }
      mma_put_sum(smem, xstride, KC, b, tt, ok, sum);
    }
    ss = warp_sum(ss);
    if (lane == 0) redn[b][warp] = ss;
  }
  mma_invs(invs, redn, K, eps);
}

// Where a warp is in a tensor-core tile's items: batch of rows blocks from b0 (local index),
// rows block b0 + i, chunk c of K, slot s of the chunk's sl (group j = c GC + warp +
// MV_WARPS s); ni rows blocks in the batch.
struct MmaCur {
  int b0, i, c, s, j, sl, ni;
};

template <bool LATE, class Pre, class Epi>
__device__ __forceinline__ void mv_run_mma(const Wts& wt, const bf16_t* xin,
                                           const bf16_t* normw, bool norm, ll N, ll K,
                                           double eps, unsigned char* smem, float* red,
                                           Trace& tr, Pre pre, Epi epi) {
  __shared__ __align__(16) float part[MV_WARPS][32][4 * MMA_NT + MMA_BANKS];
  __shared__ float sums[NB][16];
  __shared__ float invs[NB];
  __shared__ float redn[NB][MV_WARPS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tid = threadIdx.x;
  const int g = lane >> 2, t = lane & 3;
  const ll row_bytes = K / 2;
  const int G = (int)(K >> 6);
  // The inputs staged at once: all of K, or chunks of MMA_KC (GC groups, a multiple of
  // MV_WARPS, so that every warp's groups stay in order across the chunks).
  const int KC = (MMA_KC > 0 && K > MMA_KC) ? MMA_KC : (int)K;
  const int GC = KC >> 6, CH = (G + GC - 1) / GC;
  const int xstride = mv_row_bytes(KC, 4);
  // The blocks of 16 rows this block takes (blockIdx.x, + gridDim.x, ...), in batches: all of
  // them with one chunk, MMA_RB with several.
  const ll RB = (N + 15) / 16;
  const int nrb = (ll)blockIdx.x < RB ? (int)((RB - 1 - blockIdx.x) / gridDim.x + 1) : 0;
  const int bat = CH == 1 ? (nrb > 0 ? nrb : 1) : MMA_RB;
  // Group slots a warp takes in chunk c (the last ones past G are empty).
  auto slots = [&](int c) {
    const int gc = G - c * GC < GC ? G - c * GC : GC;
    return (gc + MV_WARPS - 1) / MV_WARPS;
  };
  // Rows blocks in the batch from b0 (1 past the last: the loads' cursor runs on).
  auto in_batch = [&](int b0) { return nrb - b0 >= bat ? bat : nrb - b0 > 0 ? nrb - b0 : 1; };
  const MmaCur first{0, 0, 0, 0, warp, slots(0), in_batch(0)};
  // The next item; true where a (rows block, chunk) segment ended.
  auto advance = [&](MmaCur& k) {
    k.j += MV_WARPS;
    if (++k.s < k.sl) return false;
    k.s = 0;
    if (++k.i == k.ni) {
      k.i = 0;
      if (++k.c == CH) {
        k.c = 0;
        k.b0 += bat;
        k.ni = in_batch(k.b0);
      }
      k.sl = slots(k.c);
    }
    k.j = k.c * GC + warp;
    return true;
  };
#if MMA_ASYNC
  // Warp w's slot u: 16 rows x 32 bytes of codes (row r at 32 r), then 32 words of scales
  // (row r at word r) and biases (row r at 16 + r), each the aligned word holding the value;
  // pm[u] bit l: lane l's value is its word's high half.
  __shared__ __align__(16) unsigned char ring[MV_WARPS][MMA_BATCH][MMA_SLOT];
  u32 pm[MMA_BATCH];
  // Lane l copies row l / 2's bytes 16 (l & 1) .. + 16 and row (l & 15)'s scale (l < 16) or
  // bias.
  const unsigned char* cw = nullptr;
  const bf16_t* csb = nullptr;
#else
  uint2 q[MMA_BATCH][2];
  u32 sb[MMA_BATCH][2];
#endif
  MmaCur lc = first;  // the next item to load
  // Where lane (g, t) reads in rows block lc.b0 + lc.i: rows g and g + 8 (the last row for
  // those past N).
  const unsigned char* lw[2];
  const bf16_t* ls[2];
  const bf16_t* lb[2];
  auto rows_at = [&]() {
    const ll rb = blockIdx.x + (ll)(lc.b0 + lc.i) * gridDim.x;
#if MMA_ASYNC
    {
      ll row = 16 * rb + (lane >> 1);
      row = row < N ? row : N - 1;
      int pt;
      ll phys;
      wt.wrow(row, pt, phys);
      cw = wt.words(pt) + phys * row_bytes + 16 * (lane & 1);
      row = 16 * rb + (lane & 15);
      row = row < N ? row : N - 1;
      wt.wrow(row, pt, phys);
      csb = (lane < 16 ? wt.scales(pt) : wt.biases(pt)) + phys * G;
    }
    return;
#endif
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      ll row = 16 * rb + g + 8 * h;
      row = row < N ? row : N - 1;
      int pt;
      ll phys;
      wt.wrow(row, pt, phys);
      lw[h] = wt.words(pt) + phys * row_bytes + 8 * t;
      ls[h] = wt.scales(pt) + phys * G;
      lb[h] = wt.biases(pt) + phys * G;
    }
  };
  rows_at();
#if MMA_ASYNC
#define MMA_LOAD(u)                                                                    \
  {                                                                                    \
    const int j = lc.j;                                                                \
    const bool on = lc.b0 < nrb && j < G;                                              \
    const unsigned long long sa = (unsigned long long)(csb + (on ? j : 0));            \
    if (on) {                                                                          \
      cp_async16(ring[warp][u] + 16 * lane, cw + 32 * j);                              \
      cp_async4(ring[warp][u] + 512 + 4 * lane, (const void*)(sa & ~3ull));            \
    }                                                                                  \
    pm[u] = __ballot_sync(0xffffffffu, (sa >> 1) & 1);                                 \
    cp_async_commit();                                                                 \
    if (advance(lc)) rows_at();                                                        \
  }
#else
#define MMA_LOAD(u)                         \
  {                                         \
    const int j = lc.j;                     \
    if (lc.b0 < nrb && j < G) {             \
      q[u][0] = ld_stream2(lw[0] + 32 * j); \
      q[u][1] = ld_stream2(lw[1] + 32 * j); \
      sb[u][0] = ld_sb(ls[0], lb[0], j);    \
      sb[u][1] = ld_sb(ls[1], lb[1], j);    \
    }                                       \
    if (advance(lc)) rows_at();             \
  }
#endif
#pragma unroll
  for (int u = 0; u < MMA_BATCH; ++u) MMA_LOAD(u)
  pdl_wait_then_release();
  tr.mark(1);
  // Chunk c's inputs of every sequence into shared memory (the whole input with one chunk).
  bool have_inv = false;
  // MMA_LATE_NORM (LATE: matvec_qkv's and matvec_norm's products): a normed product with all
  // of K staged scales its sums by invs at the end.
  const bool late = LATE && MMA_LATE_NORM && norm && CH == 1;
  auto stage = [&](int c) {
    const int k0 = c * KC, kn = K - k0 < KC ? (int)(K - k0) : KC;
    mma_copy(smem, xstride, xin, K, k0 >> 3, kn >> 3);
    if (late) {
      mma_finish_late(smem, xstride, KC, normw, invs, redn, K, eps);
      return;
    }
    if (norm && !have_inv) mma_inv_rms(invs, redn, smem, xstride, xin, K, eps, CH == 1);
    have_inv = true;
    mma_finish(smem, xstride, KC, normw, invs, k0 >> 3, kn >> 3, norm);
  };
  stage(0);
  tr.mark(2);
  float acc[MMA_NT][4];
  float keep[MMA_RB][MMA_NT][4];
#pragma unroll
  for (int nt = 0; nt < MMA_NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
#pragma unroll
  for (int r = 0; r < MMA_RB; ++r)
#pragma unroll
    for (int nt = 0; nt < MMA_NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) keep[r][nt][e] = 0.f;
  MmaCur cc = first;  // the item being summed
  // The XOR of lane (g, t)'s chunk sum reads: its columns n = 8 nt + 2 t + (e & 1) all have
  // (n >> 1) & 3 = t.
  const int sum_x = mma_sum_x(2 * t, KC);
  int done = 0;       // rows blocks whose epilogue ran (they run in order)
  // The epilogue's thread (row group erg, sequence en) loads what it reads from memory
  // (pre: the residual, the position and RoPE table) a rows block ahead, as mv_run's lanes
  // do: loaded at the epilogue, its latency stood between the block's two barriers.
  const bool epi_thread = tid < (16 / MV_ROWS) * NB;
  const int erg = tid % (16 / MV_ROWS), en = tid / (16 / MV_ROWS);
  decltype(pre(0, 0)) early{};
  auto early_for = [&](int c) {
    const ll r0 = 16 * ((ll)blockIdx.x + (ll)c * gridDim.x) + MV_ROWS * erg;
    if (epi_thread && c < nrb && r0 < N) early = pre(r0, en);
  };
  early_for(0);
  while (cc.b0 < nrb) {
#pragma unroll
    for (int u = 0; u < MMA_BATCH; ++u) {
      if (cc.b0 < nrb) {
        const int j = cc.j, jl = j - cc.c * GC;
#if MMA_ASYNC
        // This item's group is in (all but the MMA_BATCH - 1 newest), every lane's.
        cp_async_wait_group<MMA_BATCH - 1>();
        __syncwarp();
#endif
        if (j < G) {
#if MMA_ASYNC
          // The item's codes and (scale, bias) words, as the register loads would hold them.
          uint2 q[1][2];
          u32 sb[1][2];
          {
            const unsigned char* st = ring[warp][u];
            q[0][0] = *(const uint2*)(st + 32 * g + 8 * t);
            q[0][1] = *(const uint2*)(st + 32 * (g + 8) + 8 * t);
            const u32* sw = (const u32*)(st + 512);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int r = g + 8 * h;
              const u32 s16 = (sw[r] >> (16 * ((pm[u] >> r) & 1))) & 0xffffu;
              const u32 b16 = (sw[16 + r] >> (16 * ((pm[u] >> (16 + r)) & 1))) & 0xffffu;
              sb[0][h] = s16 | (b16 << 16);
            }
          }
#define MMA_U 0
#else
#define MMA_U u
#endif
          // B's column g of column tile nt: sequence 8 nt + g's inputs (columns past NB
          // multiply zeros).
          u32 bx[MMA_NT][8];
#pragma unroll
          for (int nt = 0; nt < MMA_NT; ++nt) {
            const int sq = 8 * nt + g;
            uint4 x0 = {0u, 0u, 0u, 0u}, x1 = {0u, 0u, 0u, 0u};
            if (sq < NB) {
              const uint4* xg = (const uint4*)(smem + sq * xstride);
              x0 = xg[mma_slot(8 * jl + 2 * t, sq)];
              x1 = xg[mma_slot(8 * jl + 2 * t + 1, sq)];
            }
            bx[nt][0] = x0.x, bx[nt][1] = x0.y, bx[nt][2] = x0.z, bx[nt][3] = x0.w;
            bx[nt][4] = x1.x, bx[nt][5] = x1.y, bx[nt][6] = x1.z, bx[nt][7] = x1.w;
          }
          float d[MMA_NT][4];
#pragma unroll
          for (int nt = 0; nt < MMA_NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) d[nt][e] = 0.f;
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            // Codes 4 s .. 4 s + 3 of each row: logical k 2t, 2t+1 (a[0], a[1]) and
            // 2t+8, 2t+9 (a[2], a[3]); inputs 4 s .. 4 s + 3 the same k of B.
            const u32 w0 = (s < 2 ? q[MMA_U][0].x : q[MMA_U][0].y) >> (16 * (s & 1));
            const u32 w1 = (s < 2 ? q[MMA_U][1].x : q[MMA_U][1].y) >> (16 * (s & 1));
            const u32 a[4] = {codes_bf2(w0), codes_bf2(w1), codes_bf2(w0 >> 8), codes_bf2(w1 >> 8)};
#pragma unroll
            for (int nt = 0; nt < MMA_NT; ++nt) {
              const u32 b[2] = {bx[nt][2 * s], bx[nt][2 * s + 1]};
              mma16816(d[nt], a, b);
            }
          }
#pragma unroll
          for (int nt = 0; nt < MMA_NT; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int n = 8 * nt + 2 * t + (e & 1);
              float xsum = 0.f;
              if (n < NB) {
                const float* xc = mv_chunk_sums(smem + n * xstride, KC);
                // Sums 2 jl and 2 jl + 1, side by side wherever they sit (one 8-byte read).
                const float2 x2 = *(const float2*)(xc + ((2 * jl) ^ sum_x));
                xsum = x2.x + x2.y;
              }
              acc[nt][e] += lo2f(sb[MMA_U][e >> 1]) * d[nt][e] + hi2f(sb[MMA_U][e >> 1]) * xsum;
            }
          }
        }
#undef MMA_U
#if MMA_ASYNC
        // Every lane is past the slot's words before it is refilled.
        __syncwarp();
#endif
        MMA_LOAD(u)
        const int ci = cc.i, cch = cc.c;
        if (advance(cc)) {
          if (cch == CH - 1) {
            // 16 rows done: the warps' sums in warp order, then the epilogue.
            const ll rb = blockIdx.x + (ll)done * gridDim.x;
#pragma unroll
            for (int nt = 0; nt < MMA_NT; ++nt)
#pragma unroll
              for (int e = 0; e < 4; ++e) part[warp][lane][4 * nt + e] = acc[nt][e];
            __syncthreads();
            if (tid < 16 * NB) {
              const int r = tid & 15, n = tid >> 4, nn = n & 7;
              const int l = 4 * (r & 7) + (nn >> 1), e = 4 * (n >> 3) + 2 * (r >> 3) + (nn & 1);
              float v = 0.f;
              for (int w = 0; w < MV_WARPS; ++w) v += part[w][l][e];
              sums[n][r] = late ? v * invs[n] : v;
            }
            __syncthreads();
            if (epi_thread) {
              const ll r0 = 16 * rb + MV_ROWS * erg;
              if (r0 < N) epi(r0, en, &sums[en][MV_ROWS * erg], early);
            }
            ++done;
            early_for(done);
          } else {
            // The rows block's sums so far, until its next chunk.
#pragma unroll
            for (int r = 0; r < MMA_RB; ++r)
#pragma unroll
              for (int nt = 0; nt < MMA_NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) keep[r][nt][e] = r == ci ? acc[nt][e] : keep[r][nt][e];
          }
          // A new chunk: every warp is past the last one's inputs before they are replaced.
          if (CH > 1 && cc.i == 0 && cc.b0 < nrb) {
            __syncthreads();
            stage(cc.c);
          }
          // The next segment's sums: from 0 in a chunk 0, else what its rows block kept.
#pragma unroll
          for (int nt = 0; nt < MMA_NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float v = 0.f;
#pragma unroll
              for (int r = 0; r < MMA_RB; ++r) v = r == cc.i ? keep[r][nt][e] : v;
              acc[nt][e] = cc.c == 0 ? 0.f : v;
            }
        }
      }
    }
  }
#undef MMA_LOAD
  if (tr.buf) __syncthreads();
}

// MMA_PAIR (the host sets it on wide tiles unless MLX_GRAPH_MMA_PAIR=0; 0 otherwise): a warp's
// item is one group of 64 inputs of two rows blocks (32 rows), a block's rows blocks i and i + 1
// of a batch (rb = blockIdx.x + i gridDim.x, as mv_run_mma takes them): the two A fragments
// multiply the same B fragments (read once) and their sums scale by the same chunk sums (read
// once), in two independent mma.sync chains. Each rows block still sums its groups j = warp,
// warp + 8, ... in order in its own registers, and the warps' sums are added in warp order by
// the same epilogue, run once a rows block (the two one after the other: a second `part` does
// not fit the 48 KiB of static shared memory beside the ring). So every output is
// mv_run_mma's, bit for bit (graph_emulate.py's mma_bit_check and the step dumps). Where a
// block's batch holds an odd number of rows blocks, its last rows block runs alone, today's item
// (the item lambda of one rows block: no second chain; its half of the ring slot is not loaded). The ring (MMA_ASYNC) holds MMA_PBATCH pair items a warp (the same 30 KiB: two
// 640-byte slots an item); without it the register loads hold MMA_PBATCH pairs.
#ifndef MMA_PAIR
#define MMA_PAIR 0
#endif
#if MMA_PAIR
// With chunks of K a batch is MMA_RB = 2 rows blocks, one pair: its sums stay in acc across
// the chunks (mv_run_mma keeps each rows block's in keep[] while the other's run).
static_assert(MMA_RB == 2, "a pair item's rows blocks are a batch's");
#if MMA_ASYNC
#define MMA_PBATCH 3
#else
#define MMA_PBATCH 4
#endif

// An item of mv_run_mma_pair of P rows blocks (2: the pair; 1: the batch's lone last rows
// block, today's item): B's fragments and the chunk sums read once, P mma.sync chains into
// acc[0..P). A function template, not a generic lambda: NVRTC takes a generic lambda's call
// operator in device code for a host function and refuses the source.
template <int P>
__device__ __forceinline__ void mma_pair_item(float (&acc)[2][MMA_NT][4],
                                              unsigned char* smem, int xstride, int KC,
                                              int g, int t, int sum_x, int jl,
                                              const uint2 (&qq)[2][2], const u32 (&ss)[2][2]) {
  u32 bx[MMA_NT][8];
#pragma unroll
  for (int nt = 0; nt < MMA_NT; ++nt) {
    const int sq = 8 * nt + g;
    uint4 x0 = {0u, 0u, 0u, 0u}, x1 = {0u, 0u, 0u, 0u};
    if (sq < NB) {
      const uint4* xg = (const uint4*)(smem + sq * xstride);
      x0 = xg[mma_slot(8 * jl + 2 * t, sq)];
      x1 = xg[mma_slot(8 * jl + 2 * t + 1, sq)];
    }
    bx[nt][0] = x0.x, bx[nt][1] = x0.y, bx[nt][2] = x0.z, bx[nt][3] = x0.w;
    bx[nt][4] = x1.x, bx[nt][5] = x1.y, bx[nt][6] = x1.z, bx[nt][7] = x1.w;
  }
  float d[P][MMA_NT][4];
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int nt = 0; nt < MMA_NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) d[p][nt][e] = 0.f;
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    u32 a[P][4];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const u32 w0 = (s < 2 ? qq[p][0].x : qq[p][0].y) >> (16 * (s & 1));
      const u32 w1 = (s < 2 ? qq[p][1].x : qq[p][1].y) >> (16 * (s & 1));
      a[p][0] = codes_bf2(w0), a[p][1] = codes_bf2(w1);
      a[p][2] = codes_bf2(w0 >> 8), a[p][3] = codes_bf2(w1 >> 8);
    }
#pragma unroll
    for (int nt = 0; nt < MMA_NT; ++nt) {
      const u32 b[2] = {bx[nt][2 * s], bx[nt][2 * s + 1]};
#pragma unroll
      for (int p = 0; p < P; ++p) mma16816(d[p][nt], a[p], b);
    }
  }
#pragma unroll
  for (int nt = 0; nt < MMA_NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int n = 8 * nt + 2 * t + (e & 1);
      float xsum = 0.f;
      if (n < NB) {
        const float* xc = mv_chunk_sums(smem + n * xstride, KC);
        const float2 x2 = *(const float2*)(xc + ((2 * jl) ^ sum_x));
        xsum = x2.x + x2.y;
      }
#pragma unroll
      for (int p = 0; p < P; ++p)
        acc[p][nt][e] += lo2f(ss[p][e >> 1]) * d[p][nt][e] + hi2f(ss[p][e >> 1]) * xsum;
    }
  }
}

template <bool LATE, class Pre, class Epi>
__device__ __forceinline__ void mv_run_mma_pair(const Wts& wt, const bf16_t* xin,
                                                const bf16_t* normw, bool norm, ll N, ll K,
                                                double eps, unsigned char* smem, float* red,
                                                Trace& tr, Pre pre, Epi epi) {
  __shared__ __align__(16) float part[MV_WARPS][32][4 * MMA_NT + MMA_BANKS];
  __shared__ float sums[NB][16];
  __shared__ float invs[NB];
  __shared__ float redn[NB][MV_WARPS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tid = threadIdx.x;
  const int g = lane >> 2, t = lane & 3;
  const ll row_bytes = K / 2;
  const int G = (int)(K >> 6);
  const int KC = (MMA_KC > 0 && K > MMA_KC) ? MMA_KC : (int)K;
  const int GC = KC >> 6, CH = (G + GC - 1) / GC;
  const int xstride = mv_row_bytes(KC, 4);
  const ll RB = (N + 15) / 16;
  const int nrb = (ll)blockIdx.x < RB ? (int)((RB - 1 - blockIdx.x) / gridDim.x + 1) : 0;
  const int bat = CH == 1 ? (nrb > 0 ? nrb : 1) : MMA_RB;
  auto slots = [&](int c) {
    const int gc = G - c * GC < GC ? G - c * GC : GC;
    return (gc + MV_WARPS - 1) / MV_WARPS;
  };
  auto in_batch = [&](int b0) { return nrb - b0 >= bat ? bat : nrb - b0 > 0 ? nrb - b0 : 1; };
  const MmaCur first{0, 0, 0, 0, warp, slots(0), in_batch(0)};
  // The next pair item (rows blocks i, i + 1 of the batch); true where a segment ended.
  auto advance = [&](MmaCur& k) {
    k.j += MV_WARPS;
    if (++k.s < k.sl) return false;
    k.s = 0;
    k.i += 2;
    if (k.i >= k.ni) {
      k.i = 0;
      if (++k.c == CH) {
        k.c = 0;
        k.b0 += bat;
        k.ni = in_batch(k.b0);
      }
      k.sl = slots(k.c);
    }
    k.j = k.c * GC + warp;
    return true;
  };
#if MMA_ASYNC
  // Warp w's pair slot u, half h: mv_run_mma's slot of rows block i + h.
  __shared__ __align__(16) unsigned char ring[MV_WARPS][MMA_PBATCH][2][MMA_SLOT];
  u32 pm[MMA_PBATCH][2];
  const unsigned char* cw[2] = {nullptr, nullptr};
  const bf16_t* csb[2] = {nullptr, nullptr};
#else
  uint2 q[MMA_PBATCH][2][2];
  u32 sb[MMA_PBATCH][2][2];
  const unsigned char* lw[2][2];
  const bf16_t* ls[2][2];
  const bf16_t* lb[2][2];
#endif
  MmaCur lc = first;  // the next pair item to load
  auto rows_at = [&]() {
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const ll rb = blockIdx.x + (ll)(lc.b0 + lc.i + p) * gridDim.x;
#if MMA_ASYNC
      ll row = 16 * rb + (lane >> 1);
      row = row < N ? row : N - 1;
      int pt;
      ll phys;
      wt.wrow(row, pt, phys);
      cw[p] = wt.words(pt) + phys * row_bytes + 16 * (lane & 1);
      row = 16 * rb + (lane & 15);
      row = row < N ? row : N - 1;
      wt.wrow(row, pt, phys);
      csb[p] = (lane < 16 ? wt.scales(pt) : wt.biases(pt)) + phys * G;
#else
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        ll row = 16 * rb + g + 8 * h;
        row = row < N ? row : N - 1;
        int pt;
        ll phys;
        wt.wrow(row, pt, phys);
        lw[p][h] = wt.words(pt) + phys * row_bytes + 8 * t;
        ls[p][h] = wt.scales(pt) + phys * G;
        lb[p][h] = wt.biases(pt) + phys * G;
      }
#endif
    }
  };
  rows_at();
#if MMA_ASYNC
#define MMA_PLOAD(u)                                                                   \
  {                                                                                    \
    const int j = lc.j;                                                                \
    const bool on = lc.b0 < nrb && j < G;                                              \
    const bool on2 = on && lc.i + 1 < lc.ni;                                           \
    _Pragma("unroll") for (int p = 0; p < 2; ++p) {                                    \
      const bool op = p == 0 ? on : on2;                                               \
      const unsigned long long sa = (unsigned long long)(csb[p] + (op ? j : 0));       \
      if (op) {                                                                        \
        cp_async16(ring[warp][u][p] + 16 * lane, cw[p] + 32 * j);                      \
        cp_async4(ring[warp][u][p] + 512 + 4 * lane, (const void*)(sa & ~3ull));       \
      }                                                                                \
      pm[u][p] = __ballot_sync(0xffffffffu, (sa >> 1) & 1);                            \
    }                                                                                  \
    cp_async_commit();                                                                 \
    if (advance(lc)) rows_at();                                                        \
  }
#else
#define MMA_PLOAD(u)                                          \
  {                                                           \
    const int j = lc.j;                                       \
    const bool on = lc.b0 < nrb && j < G;                     \
    const bool on2 = on && lc.i + 1 < lc.ni;                  \
    _Pragma("unroll") for (int p = 0; p < 2; ++p) {           \
      if (p == 0 ? on : on2) {                                \
        q[u][p][0] = ld_stream2(lw[p][0] + 32 * j);           \
        q[u][p][1] = ld_stream2(lw[p][1] + 32 * j);           \
        sb[u][p][0] = ld_sb(ls[p][0], lb[p][0], j);           \
        sb[u][p][1] = ld_sb(ls[p][1], lb[p][1], j);           \
      }                                                       \
    }                                                         \
    if (advance(lc)) rows_at();                               \
  }
#endif
#pragma unroll
  for (int u = 0; u < MMA_PBATCH; ++u) MMA_PLOAD(u)
  pdl_wait_then_release();
  tr.mark(1);
  bool have_inv = false;
  // MMA_LATE_NORM (LATE: matvec_qkv's and matvec_norm's products): a normed product with all
  // of K staged scales its sums by invs at the end.
  const bool late = LATE && MMA_LATE_NORM && norm && CH == 1;
  auto stage = [&](int c) {
    const int k0 = c * KC, kn = K - k0 < KC ? (int)(K - k0) : KC;
    mma_copy(smem, xstride, xin, K, k0 >> 3, kn >> 3);
    if (late) {
      mma_finish_late(smem, xstride, KC, normw, invs, redn, K, eps);
      return;
    }
    if (norm && !have_inv) mma_inv_rms(invs, redn, smem, xstride, xin, K, eps, CH == 1);
    have_inv = true;
    mma_finish(smem, xstride, KC, normw, invs, k0 >> 3, kn >> 3, norm);
  };
  stage(0);
  tr.mark(2);
  // acc[p]: rows block i + p's sums of the segment.
  float acc[2][MMA_NT][4];
#pragma unroll
  for (int p = 0; p < 2; ++p)
#pragma unroll
    for (int nt = 0; nt < MMA_NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[p][nt][e] = 0.f;
  MmaCur cc = first;  // the pair item being summed
  const int sum_x = mma_sum_x(2 * t, KC);
  int done = 0;  // rows blocks whose epilogue ran (in order)
  const bool epi_thread = tid < (16 / MV_ROWS) * NB;
  const int erg = tid % (16 / MV_ROWS), en = tid / (16 / MV_ROWS);
  // What the epilogue of rows blocks done and done + 1 reads from memory, loaded a pair ahead.
  decltype(pre(0, 0)) early0{}, early1{};
  auto early_for = [&](int c) {
    const ll r0 = 16 * ((ll)blockIdx.x + (ll)c * gridDim.x) + MV_ROWS * erg;
    if (epi_thread && c < nrb && r0 < N) early0 = pre(r0, en);
    const ll r1 = r0 + 16 * (ll)gridDim.x;
    if (epi_thread && c + 1 < nrb && r1 < N) early1 = pre(r1, en);
  };
  // Rows block done's epilogue (mv_run_mma's): the warps' sums a in warp order, then epi.
  auto epilogue = [&](const float (&a)[MMA_NT][4], const decltype(pre(0, 0))& ea) {
    const ll rb = blockIdx.x + (ll)done * gridDim.x;
#pragma unroll
    for (int nt = 0; nt < MMA_NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) part[warp][lane][4 * nt + e] = a[nt][e];
    __syncthreads();
    if (tid < 16 * NB) {
      const int r = tid & 15, n = tid >> 4, nn = n & 7;
      const int l = 4 * (r & 7) + (nn >> 1), e = 4 * (n >> 3) + 2 * (r >> 3) + (nn & 1);
      float v = 0.f;
      for (int w = 0; w < MV_WARPS; ++w) v += part[w][l][e];
      sums[n][r] = late ? v * invs[n] : v;
    }
    __syncthreads();
    if (epi_thread) {
      const ll r0 = 16 * rb + MV_ROWS * erg;
      if (r0 < N) epi(r0, en, &sums[en][MV_ROWS * erg], ea);
    }
    ++done;
  };
  early_for(0);
  while (cc.b0 < nrb) {
#pragma unroll
    for (int u = 0; u < MMA_PBATCH; ++u) {
      if (cc.b0 < nrb) {
        const int j = cc.j, jl = j - cc.c * GC;
#if MMA_ASYNC
        cp_async_wait_group<MMA_PBATCH - 1>();
        __syncwarp();
#endif
        if (j < G) {
#if MMA_ASYNC
          uint2 q[1][2][2];
          u32 sb[1][2][2];
#pragma unroll
          for (int p = 0; p < 2; ++p) {
            const unsigned char* st = ring[warp][u][p];
            q[0][p][0] = *(const uint2*)(st + 32 * g + 8 * t);
            q[0][p][1] = *(const uint2*)(st + 32 * (g + 8) + 8 * t);
            const u32* sw = (const u32*)(st + 512);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int r = g + 8 * h;
              const u32 s16 = (sw[r] >> (16 * ((pm[u][p] >> r) & 1))) & 0xffffu;
              const u32 b16 = (sw[16 + r] >> (16 * ((pm[u][p] >> (16 + r)) & 1))) & 0xffffu;
              sb[0][p][h] = s16 | (b16 << 16);
            }
          }
#define MMA_U 0
#else
#define MMA_U u
#endif
          // The pair, or the batch's lone last rows block alone (today's item).
          if (cc.i + 1 < cc.ni)
            mma_pair_item<2>(acc, smem, xstride, KC, g, t, sum_x, jl, q[MMA_U], sb[MMA_U]);
          else
            mma_pair_item<1>(acc, smem, xstride, KC, g, t, sum_x, jl, q[MMA_U], sb[MMA_U]);
        }
#undef MMA_U
#if MMA_ASYNC
        __syncwarp();
#endif
        MMA_PLOAD(u)
        const int cch = cc.c;
        const bool two = cc.i + 1 < cc.ni;  // the pair's second rows block is there
        if (advance(cc)) {
          if (cch == CH - 1) {
            // The pair's rows blocks done: each one's epilogue, in order.
            epilogue(acc[0], early0);
            if (two) epilogue(acc[1], early1);
            early_for(done);
          }
          if (CH > 1 && cc.i == 0 && cc.b0 < nrb) {
            __syncthreads();
            stage(cc.c);
          }
          // The next segment's sums: from 0 in a chunk 0, else the pair's so far.
#pragma unroll
          for (int p = 0; p < 2; ++p)
#pragma unroll
            for (int nt = 0; nt < MMA_NT; ++nt)
#pragma unroll
              for (int e = 0; e < 4; ++e) acc[p][nt][e] = cc.c == 0 ? 0.f : acc[p][nt][e];
        }
      }
    }
  }
#undef MMA_PLOAD
  if (tr.buf) __syncthreads();
}
#endif

// The body of the matrix-vector kernels: W [N, K] times the input (xin, or rms_norm(xin,
// normw, eps) when norm; sequence b's at xin + b K); epi(first row, b, sums, early) on lane 0
// (on lane b, with several sequences) with the warp's sums of each row group for sequence b,
// where early = pre(first row, b), loaded by that lane when the group's sums begin (what the
// epilogue reads from memory, there by its end). The grid is at most one wave: warps
// stride over the row groups, streaming their chunks (MvStream). The first MV_EARLY chunks
// are loaded before waiting for the previous kernel (weights do not depend on it), the rest
// of the first MV_BATCH after the prologue.
//
// Experts (graph_moe.cu's expert products; the defaults elsewhere): with `sel`, the N rows are
// slots of `rpe` rows, slot j's those of expert sel[j] in the stacked weights W [E rpe, K]
// (read after the wait for the previous kernel, which wrote sel: the caller waits first); with
// `per_slot`, slot j's input is its own, xin + j K (the N / rpe inputs side by side in shared
// memory), else every slot's is xin.
//
// LATE: the tensor-core tiles' normed products take MMA_LATE_NORM (matvec_qkv's and
// matvec_norm's; matvec's code stays as without the switch).
template <int BITS, int MAP, bool FP4 = false, bool LATE = false, class Pre, class Epi,
          class Wait = PdlWait>
__device__ __forceinline__ void mv_run(const Wts& wt, const bf16_t* xin,
                                       const bf16_t* normw, bool norm, ll N, ll K, ll gs,
                                       double eps, unsigned char* smem, float* red, Trace& tr,
                                       Pre pre, Epi epi, const int* sel = nullptr, ll rpe = 1,
                                       bool per_slot = false, const AttnParts* ap = nullptr,
                                       Wait wait = Wait()) {
#if MV_MMA
  if (BITS == 4 && !FP4 && gs == 64 && !sel && !ap) {
    // MMA_LATE_NORM reaches the kernels that pass LATE (matvec_qkv, matvec_norm): matvec's code
    // stays as without it.
#if MMA_PAIR
    mv_run_mma_pair<LATE>(wt, xin, normw, norm, N, K, eps, smem, red, tr, pre, epi);
#else
    mv_run_mma<LATE>(wt, xin, normw, norm, N, K, eps, smem, red, tr, pre, epi);
#endif
    return;
  }
#endif
#if NB > 8
  // Tiles of more than 8 sequences are tensor-core tiles only: the host builds them for models
  // of 4-bit weights in groups of 64 alone (graph_decode.rs's `wide_tiles`), whose products
  // all take mv_run_mma above. (Not compiled: the FFMA sums of 16 sequences.)
  mv_unreachable();
#else
  // The input's width: K, or the slots' inputs side by side.
  const ll Kx = per_slot ? N / rpe * K : K;
  // The inputs' layout: mxfp4 codes multiply them unscaled, with no chunk sums (bfloat16's).
  constexpr int XB = FP4 ? 16 : BITS;
  bf16_t* xs = (bf16_t*)smem;
  float* xc = mv_chunk_sums(smem, Kx);
  const int xstride = mv_row_bytes(Kx, XB);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  MvStream<BITS, MAP, FP4> m;
#if defined(PS_LOOP) && PS_LOOP
  // The persistent step's layer loop (PS_LOOP): the items' registers defined in every phase
  // (a load leaves some unset where a warp has fewer items), so that none is live around the
  // loop from the phase before (an unset register on one path keeps the other path's value:
  // ptxas then holds it across the whole loop).
#pragma unroll
  for (int u = 0; u < MV_BATCH; ++u)
#pragma unroll
    for (int r = 0; r < MV_ROWS; ++r) {
      m.q[u][r] = uint4{};
      m.sb[u][r] = 0;
#if MV_ASYNC
      m.bi[u][r] = 0;
#endif
    }
#endif
  m.wt = wt;
  m.N = N;
  m.groups = (N + MV_ROWS - 1) / MV_ROWS;
  // The block's warps (MV_WIDE: 16).
  const int nw = MV_WIDE_ON ? (int)(blockDim.x >> 5) : MV_WARPS;
  m.stride = (ll)gridDim.x * nw;
  m.row_bytes = (int)(K * BITS / 8);
  m.gs_shift = __ffsll(gs) - 1;  // gs is a power of two (1 for bfloat16)
  m.C = (int)(K / m.VALS);
  m.G = (int)(K >> m.gs_shift);
  m.per_lane = (m.C + 31) / 32;
  m.lane = lane;
  m.lp = (ll)blockIdx.x * nw + warp;
  m.lk = 0;
  m.sel = sel;
  m.rpe = rpe;
#if MV_EARLY_NORM
  // The norm's weights are the model's, written by no kernel of the step: this thread's pieces
  // load before the wait too, ahead of the first weights (mv_prologue's one-round case; the same
  // values it would load).
  uint4 gpre[PRO_PIECES];
  const bool early_norm = norm && !ap && !per_slot && Kx / 8 <= MV_WARPS * 32 * PRO_PIECES;
  if (early_norm)
    mv_load_pieces<PRO_PIECES, false>(gpre, gpre, (const uint4*)normw, nullptr, 0, (int)(Kx / 8));
  const uint4* gp = gpre;
#else
  const uint4* gp = nullptr;
  const bool early_norm = false;
#endif
  m.group();
#pragma unroll
  for (int u = 0; u < (MV_EARLY < MV_BATCH ? MV_EARLY : MV_BATCH); ++u) m.load(u);
  wait();
  tr.mark(1);
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    if (ap) {
      mv_prologue_attn((bf16_t*)(smem + b * xstride), mv_chunk_sums(smem + b * xstride, Kx),
                       (float*)(smem + NB * xstride), *ap, b, Kx, BITS);
    } else {
      mv_prologue((bf16_t*)(smem + b * xstride), mv_chunk_sums(smem + b * xstride, Kx), red,
                  xin + b * Kx, normw, Kx, norm, eps, XB, false, gp, early_norm);
    }
  }
  tr.mark(2);
#pragma unroll
  for (int u = MV_EARLY; u < MV_BATCH; ++u) m.load(u);
  tr.arrived(m.q[0][0].x);
  ll p = (ll)blockIdx.x * nw + warp;  // the row group being summed, chunk lane + 32 k
  int k = 0;
#if NB > 1
  // Lane b < NB: sequence b's (the epilogue runs on NB lanes at once, next_group).
  static_assert(NB <= 32, "the epilogue takes a lane a sequence");
  decltype(pre(0, 0)) early =
      (lane < NB && p < m.groups) ? pre(MV_ROWS * p, lane) : decltype(pre(0, 0)){};
#else
  decltype(pre(0, 0)) early[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b)
    early[b] = (lane == 0 && p < m.groups) ? pre(MV_ROWS * p, b) : decltype(pre(0, 0)){};
#endif
  float acc[NB][MV_ROWS];
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int r = 0; r < MV_ROWS; ++r) acc[b][r] = 0.f;
  // With per-slot inputs, the row group's input begins coff chunks into the shared input.
  auto coff = [&](ll q) -> int { return per_slot ? (int)(MV_ROWS * q / rpe) * m.C : 0; };
  int co = coff(p);
  // The row group's sums are whole: across the warp, the epilogue, the next group.
#if NB > 1
  // Every lane holds every sum after warp_sum (a butterfly: each lane adds the same pairs, in
  // either order, so the same bits), and lane b < NB runs sequence b's epilogue: the NB
  // epilogues in one pass of the warp instead of NB passes of lane 0 (at 5 sequences and
  // K 4,096 they were a fifth of the kernel's instructions). The sums are the ones lane 0
  // had: the rows' bits are unchanged.
  auto next_group = [&]() {
    float mine[MV_ROWS];
#pragma unroll
    for (int r = 0; r < MV_ROWS; ++r) mine[r] = 0.f;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
#pragma unroll
      for (int r = 0; r < MV_ROWS; ++r) {
        const float s = warp_sum(acc[b][r]);
        mine[r] = lane == b ? s : mine[r];
        acc[b][r] = 0.f;
      }
    }
    if (lane < NB) epi(MV_ROWS * p, lane, mine, early);
    k = 0;
    p = p + m.stride;
    co = coff(p);
    if (lane < NB && p < m.groups) early = pre(MV_ROWS * p, lane);
  };
#else
  auto next_group = [&]() {
#pragma unroll
    for (int b = 0; b < NB; ++b) {
#pragma unroll
      for (int r = 0; r < MV_ROWS; ++r) acc[b][r] = warp_sum(acc[b][r]);
      if (lane == 0) epi(MV_ROWS * p, b, acc[b], early[b]);
#pragma unroll
      for (int r = 0; r < MV_ROWS; ++r) acc[b][r] = 0.f;
    }
    k = 0;
    p = p + m.stride;
    co = coff(p);
#pragma unroll
    for (int b = 0; b < NB; ++b)
      if (lane == 0 && p < m.groups) early[b] = pre(MV_ROWS * p, b);
  };
#endif
#if NB > 1
  // Several sequences: one item a trip, from slot 0, the slots moving down one as the next
  // item loads into the last (the items summed and loaded in the order below, so the same
  // sums): one copy of the long body instead of MV_BATCH (with the epilogue's between them,
  // ~200 KB of code at 5 sequences, past the instruction cache; results/gpu/2026-12-05-s31-spec).
#if MV_NB
  // MV_NB: MV_BATCH items a trip, item j from slot j % MV_BATCH (the one-row loop's order).
  while (p < m.groups) {
#pragma unroll
    for (int u = 0; u < MV_BATCH; ++u) {
      if (p < m.groups) {
        m.compute(u, lane + 32 * k, co, xs, xc, xstride, acc);
        m.load(u);
        if (++k == m.per_lane) next_group();
      }
    }
  }
#else
#pragma unroll 1
  while (p < m.groups) {
    m.compute(0, lane + 32 * k, co, xs, xc, xstride, acc);
    m.rotate();
    m.load(MV_BATCH - 1);
    if (++k == m.per_lane) next_group();
  }
#endif
#else
  while (p < m.groups) {
#pragma unroll
    for (int u = 0; u < MV_BATCH; ++u) {
      if (p < m.groups) {
        m.compute(u, lane + 32 * k, co, xs, xc, xstride, acc);
        m.load(u);
        if (++k == m.per_lane) next_group();
      }
    }
  }
#endif
  if (tr.buf) __syncthreads();
#endif  // NB > 8
}

// MV_BITS (the host defines GraphSpec::matvec_bits unless MLX_GRAPH_MV_BITS=0; all three then):
// the codes' widths the model's mat-vecs take, a mask of 1 << 4, 1 << 8 and 1 << 16 (bfloat16,
// the dispatch's default case). Only those instantiations of mv_run are compiled: at one width
// a module is about a third of the code and NVRTC takes about a third of the time
// (results/gpu/2026-12-07-s50). A width outside the mask traps (the host never launches one: a
// CUDA error, not a wrong output). The instantiations compiled are the same code either way.
#ifndef MV_BITS
#define MV_BITS ((1 << 4) | (1 << 8) | (1 << 16))
#endif
// Runs mv_run with the codes' width, the weights' map (Wts) and LATE as template arguments.
#define MV_DISPATCH_MAP(bits, MAP, LATE, ...)                                      \
  switch (bits) {                                                                  \
    case 4:                                                                        \
      if constexpr ((MV_BITS >> 4) & 1) mv_run<4, MAP, false, LATE>(__VA_ARGS__);   \
      else mv_unreachable();                                                       \
      break;                                                                       \
    case 8:                                                                        \
      if constexpr ((MV_BITS >> 8) & 1) mv_run<8, MAP, false, LATE>(__VA_ARGS__);   \
      else mv_unreachable();                                                       \
      break;                                                                       \
    default:                                                                       \
      if constexpr ((MV_BITS >> 16) & 1) mv_run<16, MAP, false, LATE>(__VA_ARGS__); \
      else mv_unreachable();                                                       \
      break;                                                                       \
  }
// With the map one of WMAP_ONE and WMAP_PAIR (wt.map).
#define MV_DISPATCH(bits, LATE, ...)                            \
  if (wt.map == WMAP_PAIR) {                                    \
    MV_DISPATCH_MAP(bits, WMAP_PAIR, LATE, __VA_ARGS__)         \
  } else {                                                      \
    MV_DISPATCH_MAP(bits, WMAP_ONE, LATE, __VA_ARGS__)          \
  }

// mlx-lm's nn.gelu_approx on a bfloat16 value, rounded after every op as MLX computes it in
// the activations' dtype (its scalars are weak: bfloat16 too):
// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
__device__ __forceinline__ float gelu_approx(float x) {
  const float c1 = rbf(0.044715f), c2 = rbf(0.7978845608028654f);
  const float x3 = rbf(x * x * x);
  const float inner = rbf(x + rbf(c1 * x3));
  const float t = rbf(tanhf(rbf(c2 * inner)));
  return rbf(rbf(0.5f * x) * rbf(1.f + t));
}

// tanh(v / cap) * cap in bfloat16 ops (gemma2's soft-caps; cap a bfloat16 value).
__device__ __forceinline__ float softcap_bf(float v, float cap) {
  return rbf(rbf(tanhf(rbf(v / cap))) * cap);
}

// With a residual (mode RES), sequence b's residual values for the row group at r0 (row b of
// res, N values; two a word, an odd N's last row alone): what matvec's and matvec_attn_out's
// epilogues add, loaded ahead of them (their `pre`).
struct MvRes {
  u32 v[MV_ROWS / 2];
};
__device__ __forceinline__ MvRes mv_res_load(const bf16_t* res, ll N, ll mode, ll r0, int b) {
  MvRes e{};
  if (mode & MODE_RES) {
    const bf16_t* rb = res + b * N;
#pragma unroll
    for (int r = 0; r < MV_ROWS; r += 2) {
      const ll i = r0 + r;
      if (i + 1 < N) {
        e.v[r / 2] = *(const u32*)(rb + i);
      } else if (i < N) {
        e.v[r / 2] = rb[i];
      }
    }
  }
  return e;
}

// out = W x for W [N, K] (bfloat16, or MLX affine-quantized with BITS-bit codes, group gs,
// bfloat16 scales and biases): W0 (S0, B0), or with SWIGLU gate W0 (S0, B0) and up W1 (S1,
// B1), the model's own arrays (Wts); x [K] bfloat16.
// mode: NORM: x = rms_norm(xin, normw, eps) first;
//       RES: out = res + (W x) (out may be res; each element is read and written by one lane);
//       SWIGLU: rows are read interleaved (gate_i, up_i: WMAP_PAIR); out[i] = silu(gate_i) * up_i
//               (with GELU: gelu_approx(gate_i) * up_i, Gemma's GeGLU);
//       F32: out is float32 (the bfloat16-rounded values), soft-capped when cap > 0, divided
//            by -cap when cap < 0 (granite's logits_scaling, a bfloat16 value);
//       RES with cap != 0: out = res + (W x) cap, the product rounded first (granite's
//            residual_multiplier, a bfloat16 value);
//       BIAS (compiled only where MV_OUT_BIAS is 1: gpt_oss's biased output projection and
//            router), without SWIGLU or F32: W x + bias, the bias B1 [N] (bfloat16; W1, S1
//            and B1 are unused without SWIGLU), added as MLX adds a linear's bias: in the
//            product's one rounding for bfloat16 weights (addmm), after the rounded
//            quantized product otherwise; then the residual, as RES.
#ifndef MV_OUT_BIAS
#define MV_OUT_BIAS 0
#endif
#define MODE_BIAS 64
// matvec's body (the kernel below, matvec_norm; the persistent step's phases), its shared
// memory and wait passed in; LATE: mv_run's (matvec_norm's).
template <bool LATE, class Wait>
__device__ __forceinline__ void matvec_body(
    const void* W0, const void* W1, const bf16_t* S0, const bf16_t* S1, const bf16_t* B0,
    const bf16_t* B1, const bf16_t* xin, const bf16_t* normw, const bf16_t* res, void* out, ll N,
    ll K, ll bits, ll gs, ll mode, double eps, u64* trace, double cap, unsigned char* smem,
    float* red, Wait wait) {
  Trace tr{trace, {0, 0, 0, 0}};
  tr.mark(0);
  // With a residual, its values for the group's rows (mv_res_load).
  using Res = MvRes;
  // Sequence b's residual and output: row b of each (N values; N / 2 with SWIGLU).
  const ll out_n = (mode & MODE_SWIGLU) ? N / 2 : N;
  auto pre = [&](ll r0, int b) { return mv_res_load(res, N, mode, r0, b); };
  auto epi = [&](ll r0, int b, const float* acc, const Res& e) {
    void* out_b = (mode & MODE_F32) ? (void*)((float*)out + b * out_n)
                                    : (void*)((bf16_t*)out + b * out_n);
#pragma unroll
    for (int r = 0; r < MV_ROWS; r += 2) {
      const ll i = r0 + r;  // rows i and i + 1
      if (i >= N) break;
      const bool has1 = i + 1 < N;
      if (mode & MODE_SWIGLU) {
        const float g = rbf(acc[r]), u = rbf(acc[r + 1]);
        if (mode & MODE_GELU) {
          ((bf16_t*)out_b)[i / 2] = f2bf(gelu_approx(g) * u);
        } else {
          const float sg = rbf(1.f / (1.f + expf(-g)));
          ((bf16_t*)out_b)[i / 2] = f2bf(rbf(g * sg) * u);
        }
      } else if (mode & MODE_F32) {
        const float c = (float)cap;
        auto fin = [&](float v) {
          return c > 0.f ? softcap_bf(rbf(v), c) : c < 0.f ? rbf(rbf(v) / -c) : rbf(v);
        };
        ((float*)out_b)[i] = fin(acc[r]);
        if (has1) ((float*)out_b)[i + 1] = fin(acc[r + 1]);
      } else {
        float a0 = acc[r], a1 = acc[r + 1];
#if MV_OUT_BIAS
        if (mode & MODE_BIAS) {
          auto add = [&](float v, ll row) {
            return bits == 16 ? rbf(v + bf2f(B1[row])) : rbf(rbf(v) + bf2f(B1[row]));
          };
          a0 = add(a0, i);
          if (has1) a1 = add(a1, i + 1);
        }
#endif
        if (mode & MODE_RES) {
          const float m = (float)cap;
          auto y = [&](float v) { return m != 0.f ? rbf(rbf(v) * m) : rbf(v); };
          ((bf16_t*)out_b)[i] = f2bf(lo2f(e.v[r / 2]) + y(a0));
          if (has1) ((bf16_t*)out_b)[i + 1] = f2bf(hi2f(e.v[r / 2]) + y(a1));
        } else {
          ((bf16_t*)out_b)[i] = f2bf(a0);
          if (has1) ((bf16_t*)out_b)[i + 1] = f2bf(a1);
        }
      }
    }
  };
  const Wts wt = make_wts(W0, W1, W1, S0, S1, S1, B0, B1, B1,
                          (mode & MODE_SWIGLU) ? WMAP_PAIR : WMAP_ONE);
  MV_DISPATCH(bits, LATE, wt, xin, normw, (mode & MODE_NORM) != 0, N, K, gs, eps, smem, red, tr,
              pre, epi, nullptr, 1, false, nullptr, wait)
  tr.done(TRACE_MATVEC | (u64)mode << 8 | (u64)K << 16);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS) matvec(
    const void* W0, const void* W1, const bf16_t* S0, const bf16_t* S1, const bf16_t* B0,
    const bf16_t* B1, const bf16_t* xin, const bf16_t* normw, const bf16_t* res, void* out, ll N,
    ll K, ll bits, ll gs, ll mode, double eps, u64* trace, double cap) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float red[MV_WARPS];
  matvec_body<false>(W0, W1, S0, S1, B0, B1, xin, normw, res, out, N, K, bits, gs, mode, eps, trace,
                     cap, smem, red, PdlWait());
}
// matvec with MMA_LATE_NORM (level 2): what the host launches for the tensor-core tiles'
// normed products (MODE_NORM: gate/up, the head) in matvec's place, so that matvec's own code
// stays as without the switch. Compiled only at that level.
#if MMA_LATE_NORM >= 2
extern "C" __global__ void __launch_bounds__(MV_BOUNDS) matvec_norm(
    const void* W0, const void* W1, const bf16_t* S0, const bf16_t* S1, const bf16_t* B0,
    const bf16_t* B1, const bf16_t* xin, const bf16_t* normw, const bf16_t* res, void* out, ll N,
    ll K, ll bits, ll gs, ll mode, double eps, u64* trace, double cap) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float red[MV_WARPS];
  matvec_body<true>(W0, W1, S0, S1, B0, B1, xin, normw, res, out, N, K, bits, gs, mode, eps, trace,
                    cap, smem, red, PdlWait());
}
#endif

// The attention projections with RoPE and the cache write in the epilogue:
// [q; k; v] = W rms_norm(xin) (+ bias) with W's q and k rows taken per head so that rows
// 2i and 2i + 1 are the rotation pair (i, i + nrot) for i < nrot (the rows past 2 nrot, which
// are not rotated, keep their order); with traditional RoPE the pairs are (2i, 2i + 1)
// already. W: q, k and v as the model holds them (Wq, Sq, Bq; Wk, ...), read through WMAP_QKV
// with `pairs` pairs a head (nrot; 0 where the host has paired the rows itself, or where
// they are side by side already). nrot: the rotated pairs of a head in this layer (half of RoPE's
// dims; 0 in a layer without RoPE). q goes to qout (its usual layout, roped), k (roped) and v
// to the caches at position state[1]. rope: the step's table of cosines and sines (embed).
// bias: the projections' biases in the rows' order, or null; added as MLX adds them: after
// the rounding of a quantized product, in the same rounding as a dense one (addmm).
// Rows (nh + 2 nkv) D fit in 32 bits (the host checks).
// Whether matvec_qkv norms its input (0: OLMo 2's blocks, no pre-norm; GraphSpec::post_only
// defines it 0, so every other model compiles the kernel it always did).
#ifndef MV_QKV_NORM
#define MV_QKV_NORM 1
#endif
// matvec_qkv's body (the kernel below; the persistent step's phases), its shared memory and
// wait passed in.
template <class Wait>
__device__ __forceinline__ void matvec_qkv_body(
    const void* Wq, const void* Wk, const void* Wv, const bf16_t* Sq, const bf16_t* Sk,
    const bf16_t* Sv, const bf16_t* Bq, const bf16_t* Bk, const bf16_t* Bv, const bf16_t* xin,
    const bf16_t* normw, bf16_t* qout, bf16_t* kc, bf16_t* vc, const int* state, ll K, ll bits,
    ll gs, ll nh, ll nkv, ll D, ll cap, ll traditional, double eps, const float* rope,
    u64* trace, ll nrot, const bf16_t* bias, ll pairs, unsigned char* smem, float* red,
    Wait wait) {
  Trace tr{trace, {0, 0, 0, 0}};
  tr.mark(0);
  const int Di = (int)D, half = Di / 2, qrows = (int)nh * Di, krows = qrows + (int)nkv * Di;
  const int nr = (int)nrot;
  // Where a group's pairs go, and (for q and k) their rotation, loaded when the group begins:
  // the position (read after the wait), each pair's head and index within it.
  struct Pre {
    int pos, slot;
    int head[MV_ROWS / 2], i[MV_ROWS / 2];
    float c[MV_ROWS / 2], s[MV_ROWS / 2];
  };
  // Sequence b: its state, its RoPE table (2 D floats a row), its q rows and cache slot.
  const ll rows_all = (nh + 2 * nkv) * D, slot = nkv * cap * D;
  auto pre = [&](ll r0, int b) {
    Pre e;
    e.pos = state[4 * b + 1];
    e.slot = b - state[4 * b + 3];  // a verify group's rows share its first row's slot
    const float* rope_b = rope + (ll)b * 2 * D;
#pragma unroll
    for (int r = 0; r < MV_ROWS; r += 2) {
      const int i0 = (int)r0 + r;
      const int j = i0 < qrows ? i0 : i0 < krows ? i0 - qrows : i0 - krows;
      e.head[r / 2] = j / Di;
      e.i[r / 2] = j % Di;  // for q and k, twice the pair's index
      e.c[r / 2] = 1.f;
      e.s[r / 2] = 0.f;
      if (i0 < krows && e.i[r / 2] / 2 < nr) {
        e.c[r / 2] = rope_b[e.i[r / 2] / 2];
        e.s[r / 2] = rope_b[half + e.i[r / 2] / 2];
      }
    }
    return e;
  };
  // A row's value as MLX rounds it: the product, plus the bias where there is one.
  auto value = [&](float acc, int row) {
    if (!bias) return rbf(acc);
    const float b = bf2f(bias[row]);
    return bits == 16 ? rbf(acc + b) : rbf(rbf(acc) + b);
  };
  auto epi = [&](ll r0, int b, const float* acc, const Pre& e) {
    if (e.pos < 0) return;  // an idle row
    bf16_t* const qo = qout + b * rows_all;
    bf16_t* const kcb = kc + e.slot * slot;
    bf16_t* const vcb = vc + e.slot * slot;
#pragma unroll
    for (int r = 0; r < MV_ROWS; r += 2) {
      const int i0 = (int)r0 + r;  // rows i0 and i0 + 1: a rotation pair of q or k, or two of v
      const float x1 = value(acc[r], i0), x2 = value(acc[r + 1], i0 + 1);
      const int h = e.head[r / 2], i = e.i[r / 2] / 2;
      const float c = e.c[r / 2], s = e.s[r / 2];
      const bool paired = i < nr && !traditional;
      const int a = paired ? i : 2 * i, b = paired ? i + nr : 2 * i + 1;
      if (i0 < krows) {
        bf16_t* dst = i0 < qrows ? qo + h * Di : kcb + ((ll)h * cap + e.pos) * D;
        if (i < nr) {
          dst[a] = f2bf(x1 * c - x2 * s);
          dst[b] = f2bf(x1 * s + x2 * c);
        } else {
          dst[a] = f2bf(x1);
          dst[b] = f2bf(x2);
        }
      } else {
        bf16_t* vd = vcb + ((ll)h * cap + e.pos) * D + e.i[r / 2];
        vd[0] = f2bf(x1);
        vd[1] = f2bf(x2);
      }
    }
  };
  // D is a multiple of MV_ROWS: every group is whole.
  const Wts wt = make_wts(Wq, Wk, Wv, Sq, Sk, Sv, Bq, Bk, Bv, WMAP_QKV, qrows, krows, D, pairs);
  MV_DISPATCH_MAP(bits, WMAP_QKV, true, wt, xin, normw, MV_QKV_NORM != 0, (nh + 2 * nkv) * D, K,
                  gs, eps, smem, red, tr, pre, epi, nullptr, 1, false, nullptr, wait)
  tr.done(TRACE_QKV | (u64)K << 16);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS) matvec_qkv(
    const void* Wq, const void* Wk, const void* Wv, const bf16_t* Sq, const bf16_t* Sk,
    const bf16_t* Sv, const bf16_t* Bq, const bf16_t* Bk, const bf16_t* Bv, const bf16_t* xin,
    const bf16_t* normw, bf16_t* qout, bf16_t* kc, bf16_t* vc, const int* state, ll K, ll bits,
    ll gs, ll nh, ll nkv, ll D, ll cap, ll traditional, double eps, const float* rope,
    u64* trace, ll nrot, const bf16_t* bias, ll pairs) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float red[MV_WARPS];
  matvec_qkv_body(Wq, Wk, Wv, Sq, Sk, Sv, Bq, Bk, Bv, xin, normw, qout, kc, vc, state, K, bits, gs,
                  nh, nkv, D, cap, traditional, eps, rope, trace, nrot, bias, pairs, smem, red,
                  PdlWait());
}

// The output projection of an attention whose partials are not combined yet (attention with
// counters null): out = [res +] W x with x the attention's output, which every block combines
// from the partials in its prologue (mv_prologue_attn: the bits attention's combining block
// writes), one dependent step less a layer than attention's last-block combine, its fence,
// atomic and reloads. W0 (S0, B0) as matvec's; po, pml the attention's partials (nh heads,
// NS chunks a head), state the step state; mode 0 or MODE_RES (with cap: the residual
// multiplier), as matvec's.
// matvec_attn_out's body (the kernel below; the persistent step's phases), its shared memory
// and wait passed in.
template <class Wait>
__device__ __forceinline__ void matvec_attn_out_body(
    const void* W0, const bf16_t* S0, const bf16_t* B0, const float* po, const float* pml,
    const int* state, const bf16_t* res, bf16_t* out, ll N, ll K, ll bits, ll gs, ll mode,
    ll nh, ll NS, u64* trace, double cap, unsigned char* smem, float* red, Wait wait) {
  Trace tr{trace, {0, 0, 0, 0}};
  tr.mark(0);
  using Res = MvRes;
  auto pre = [&](ll r0, int b) { return mv_res_load(res, N, mode, r0, b); };
  auto epi = [&](ll r0, int b, const float* acc, const Res& e) {
    bf16_t* out_b = out + b * N;
    const float m = (float)cap;
    auto y = [&](float v) { return m != 0.f ? rbf(rbf(v) * m) : rbf(v); };
#pragma unroll
    for (int r = 0; r < MV_ROWS; r += 2) {
      const ll i = r0 + r;
      if (i >= N) break;
      const bool has1 = i + 1 < N;
      if (mode & MODE_RES) {
        out_b[i] = f2bf(lo2f(e.v[r / 2]) + y(acc[r]));
        if (has1) out_b[i + 1] = f2bf(hi2f(e.v[r / 2]) + y(acc[r + 1]));
      } else {
        out_b[i] = f2bf(acc[r]);
        if (has1) out_b[i + 1] = f2bf(acc[r + 1]);
      }
    }
  };
  const AttnParts ap{po, pml, state, nh, NS};
  const Wts wt = make_wts(W0, W0, W0, S0, S0, S0, B0, B0, B0, WMAP_ONE);
  MV_DISPATCH_MAP(bits, WMAP_ONE, false, wt, (const bf16_t*)po, (const bf16_t*)po, false, N, K,
                  gs, 0.0, smem, red, tr, pre, epi, nullptr, 1, false, &ap, wait)
  tr.done(TRACE_MATVEC | (u64)(mode | 32) << 8 | (u64)K << 16);
}
extern "C" __global__ void __launch_bounds__(256, MV_MIN_BLOCKS) matvec_attn_out(
    const void* W0, const bf16_t* S0, const bf16_t* B0, const float* po, const float* pml,
    const int* state, const bf16_t* res, bf16_t* out, ll N, ll K, ll bits, ll gs, ll mode,
    ll nh, ll NS, u64* trace, double cap) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float red[MV_WARPS];
  matvec_attn_out_body(W0, S0, B0, po, pml, state, res, out, N, K, bits, gs, mode, nh, NS, trace,
                       cap, smem, red, PdlWait());
}

// Attention of one query over the cache, split over the sequence: block (h, s) covers
// positions [64 s, 64 s + 64) and writes its unnormalised output, max and sum; the last block
// of a head to finish (counted in counters[h], which it resets) combines them:
// out[h] = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s.
// With counters null, no block combines: the output projection's blocks do, in their
// prologue (matvec_attn_out, attn_combine_piece: the same sums in the same order).
// window > 0 (a sliding layer): only the last `window` positions, this one included, as
// mlx-lm's RotatingKVCache of max_size window holds them at a decode step; positions before
// are masked (a chunk wholly before them loads nothing and passes m = -inf, l = 0 on).
// softcap > 0 (gemma2): scores = tanh(s / softcap) softcap, with the query scaled and each
// op rounded to bfloat16 as mlx-lm's gemma2 computes them (softcap a bfloat16 value).
// sinks (gpt_oss's attention sinks, compiled only where ATTN_SINKS is 1; gpt_oss maps them,
// opt-in behind MLX_GRAPH_GPT_OSS): head h's sink logit sinks[h] (bfloat16) joins the softmax's max and denominator with
// no value: chunk 0's block takes it into its max m and its sum l, so both combines (the last
// block's, matvec_attn_out's) divide by it as mlx's sdpa with `sinks` does.
// 128 threads; D 16, 32, 64 or 128.
#ifndef ATTN_SINKS
#define ATTN_SINKS 0
#endif
// attention's body (the kernel below; the persistent step's phases): block (ix.x(), ix.y()) of
// the kernel's grid, thread ix.t() of its 128, its shared memory, wait and barrier passed in.
template <class Wait, class Sync, class Idx>
__device__ __forceinline__ void attention_body(
    const bf16_t* qb, const bf16_t* kc, const bf16_t* vc, const int* state, float* po,
    float* pml, int* counters, bf16_t* out, ll nh, ll nkv, ll D, ll cap, ll NS, double scale,
    u64* trace, ll window, double softcap, const bf16_t* sinks, Idx ix, float* q, float* p,
    float* part, float* red, int* last_p, Wait& wait, Sync sync) {
  Trace tr{trace, {0, 0, 0, 0}};
  tr.mark(0);
  // Block (b nh + h, s): sequence b's head h (grid nh NB by NS).
  const ll b = ix.x() / nh, h = ix.x() % nh, s = ix.y();
  state += 4 * b;
  // A verify group's row j shares the slot of the group's first row (b - j), whose positions
  // state[1] - j .. state[1] this step writes.
  const ll back = state[3];
  qb += b * (nh + 2 * nkv) * D;
  kc += (b - back) * nkv * cap * D;
  vc += (b - back) * nkv * cap * D;
  po += b * nh * NS * D;
  pml += b * nh * NS * 2;
  if (counters) counters += b * nh;
  out += b * nh * D;
  // Read before the wait: the previous step's argmax, which set it, has finished (each
  // kernel of the step started after the one before it had waited for its own predecessor).
  // An idle row (position -1) covers nothing.
  const ll L = state[1] < 0 ? 0 : (ll)state[1] + 1;
  const ll start = s * ATTN_CHUNK;
  if (start >= L) {
    wait();
    tr.mark(1);
    tr.mark(2);
    tr.done(TRACE_ATTENTION);
    return;
  }
  const ll ns = (L + ATTN_CHUNK - 1) / ATTN_CHUNK;
  const ll n = (L - start) < ATTN_CHUNK ? (L - start) : ATTN_CHUNK;
  // Rows of the chunk before `lo` are outside the window.
  const ll lo = window > 0 && L > window ? L - window - start : 0;
  const ll kvh = h / (nh / nkv);
  int& last = *last_p;
  const int tid = ix.t(), lane = tid & 31, warp = tid >> 5;
  // Every load at once: the thread's key (a thread a position), its value pieces (thread
  // (position group tp, piece td) takes 8 dimensions of positions tp, tp + P, ..., P = 1024 /
  // D position groups) and the query; then the arithmetic. The cached positions' keys and
  // values are loaded before the wait; the query and position L - 1's key and value (row
  // cur of the chunk, if it holds it), which the q/k/v kernel before this one writes, after.
  const int dg = (int)(D / 8), P = ATTN_THREADS / dg;
  const int td = tid % dg, tp = tid / dg;
  const ll cur = L - 1 - start;
  // Rows of the chunk from `fresh` on were written this step (the q/k/v kernel before this
  // one): loaded after the wait. Only row cur, but in a verify group's row.
  const ll fresh = cur - back;
  uint4 kr[16] PS_ZERO, vr[8] PS_ZERO;
  auto load_key = [&]() {
    const uint4* k = (const uint4*)(kc + (kvh * cap + start + tid) * D);
#pragma unroll
    for (int c = 0; c < 16; ++c) {  // D / 8 <= 16 pieces
      if (c < dg) kr[c] = k[c];
    }
  };
  // Value piece i: position j = tp + i P (P >= 8: 8 rounds cover the chunk).
  auto load_value = [&](int i, int j) {
    vr[i] = *(const uint4*)(vc + (kvh * cap + start + j) * D + 8 * td);
  };
  if (tid < n && tid >= lo && tid < fresh) load_key();
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int j = tp + i * P;
    if (j < n && j >= lo && j < fresh) load_value(i, j);
  }
  wait();
  tr.mark(1);
  if (tid < n && tid >= lo && tid >= fresh) load_key();
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int j = tp + i * P;
    if (j < n && j >= lo && j >= fresh) load_value(i, j);
  }
  const float cap_s = (float)softcap;
  for (ll d = tid; d < D; d += ATTN_THREADS) {
    const float qs = (float)scale * bf2f(qb[h * D + d]);
    q[d] = cap_s > 0.f ? rbf(qs) : qs;
  }
  sync();
  float sc = NEG_INF;
  if (tid < n && tid >= lo) {
    sc = 0.f;
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      if (c < dg) {
        const uint4 w = kr[c];
        const float* qq = q + 8 * c;
        sc += qq[0] * lo2f(w.x) + qq[1] * hi2f(w.x) + qq[2] * lo2f(w.y) + qq[3] * hi2f(w.y) +
              qq[4] * lo2f(w.z) + qq[5] * hi2f(w.z) + qq[6] * lo2f(w.w) + qq[7] * hi2f(w.w);
      }
    }
  }
  if (cap_s > 0.f && tid < n && tid >= lo) sc = softcap_bf(rbf(sc), cap_s);
  // Max and sum over the chunk: the chunk's 64 scores sit in warps 0 and 1.
  float m = sc;
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) red[warp] = m;
  sync();
  m = fmaxf(red[0], red[1]);
#if ATTN_SINKS
  // The sink joins chunk 0's max (and, below, its sum).
  const float sink = s == 0 && sinks ? bf2f(sinks[h]) : NEG_INF;
  m = fmaxf(m, sink);
#endif
  const float e = tid < n && tid >= lo ? expf(sc - m) : 0.f;
  if (tid < ATTN_CHUNK) p[tid] = e;
  float l = warp_sum(e);
  sync();
  if (lane == 0) red[warp] = l;
  sync();
  l = red[0] + red[1];
#if ATTN_SINKS
  if (sink != NEG_INF) l += expf(sink - m);
#endif
  // Values: each thread's 8 dimensions over its positions, then the position groups summed.
  float o[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) o[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int j = tp + i * P;
    if (j < n && j >= lo) {
      const uint4 v = vr[i];
      const float pj = p[j];
      o[0] += pj * lo2f(v.x);
      o[1] += pj * hi2f(v.x);
      o[2] += pj * lo2f(v.y);
      o[3] += pj * hi2f(v.y);
      o[4] += pj * lo2f(v.z);
      o[5] += pj * hi2f(v.z);
      o[6] += pj * lo2f(v.w);
      o[7] += pj * hi2f(v.w);
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) part[8 * tid + i] = o[i];  // = part[tp * D + 8 td + i]
  sync();
  if (tid < D) {
    float t = 0.f;
    for (int w = 0; w < P; ++w) t += part[w * D + tid];
    po[(h * NS + s) * D + tid] = t;
  }
  if (tid == 0) {
    pml[(h * NS + s) * 2] = m;
    pml[(h * NS + s) * 2 + 1] = l;
  }
  // Without counters the output projection's blocks combine the partials
  // (matvec_attn_out): nothing to count, no block waits for the others.
  if (!counters) {
    tr.mark(2);
    tr.done(TRACE_ATTENTION);
    return;
  }
  __threadfence();
  sync();
  if (tid == 0) last = atomicAdd(&counters[h], 1) == (int)(ns - 1);
  sync();
  tr.mark(2);
  if (!last) {
    tr.done(TRACE_ATTENTION);
    return;
  }
  __threadfence();
  // The combine, over tiles of 128 chunks, online: each tile's weights e^(m_t - M) go to
  // shared memory (p), its partial outputs are loaded 8 at a time (the first ATTN_EARLY
  // before the tile's maxima are known).
  float M = NEG_INF, den = 0.f, num = 0.f;
  float early[ATTN_EARLY];
#pragma unroll
  for (int i = 0; i < ATTN_EARLY; ++i)
    early[i] = tid < D && i < ns ? __ldcg(po + (h * NS + i) * D + tid) : 0.f;
  for (ll t0 = 0; t0 < ns; t0 += ATTN_THREADS) {
    const ll t = t0 + tid;
    const float mt = t < ns ? __ldcg(&pml[(h * NS + t) * 2]) : NEG_INF;
    const float lt = t < ns ? __ldcg(&pml[(h * NS + t) * 2 + 1]) : 0.f;
    float mx = mt;
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) red[warp] = mx;
    sync();
    float Mn = M;
    for (int i = 0; i < ATTN_THREADS / 32; ++i) Mn = fmaxf(Mn, red[i]);
    // 0 on the first tile; chunks wholly outside a window (m = -inf) weigh 0, even in a tile
    // of nothing else (Mn = -inf).
    const float keep = M == NEG_INF ? 0.f : expf(M - Mn);
    const float wt = t < ns && mt != NEG_INF ? expf(mt - Mn) : 0.f;
    part[tid] = wt;
    float lw = warp_sum(lt * wt);
    sync();
    if (lane == 0) red[warp] = lw;
    sync();
    float tile = 0.f;
    for (int i = 0; i < ATTN_THREADS / 32; ++i) tile += red[i];
    den = den * keep + tile;
    const int nt = (int)(ns - t0 < ATTN_THREADS ? ns - t0 : ATTN_THREADS);
    if (tid < D) {
      num *= keep;
      const float* pp = po + (h * NS + t0) * D + tid;
      int j = 0;
      if (t0 == 0) {
#pragma unroll
        for (int i = 0; i < ATTN_EARLY; ++i) {
          if (i < nt) num += early[i] * part[i];
        }
        j = nt < ATTN_EARLY ? nt : ATTN_EARLY;
      }
      for (; j + 8 <= nt; j += 8) {
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = __ldcg(pp + (j + i) * D);
#pragma unroll
        for (int i = 0; i < 8; ++i) num += v[i] * part[j + i];
      }
      for (; j < nt; ++j) num += __ldcg(pp + j * D) * part[j];
    }
    M = Mn;
    sync();
  }
  if (tid < D) out[h * D + tid] = f2bf(num / den);
  if (tid == 0) counters[h] = 0;
  tr.done(TRACE_ATTENTION | 1 << 8);
}
extern "C" __global__ void __launch_bounds__(128, 4) attention(
    const bf16_t* qb, const bf16_t* kc, const bf16_t* vc, const int* state, float* po,
    float* pml, int* counters, bf16_t* out, ll nh, ll nkv, ll D, ll cap, ll NS, double scale,
    u64* trace, ll window, double softcap, const bf16_t* sinks) {
  __shared__ __align__(16) float q[128];
  __shared__ float p[ATTN_CHUNK];
  __shared__ float part[8 * ATTN_THREADS];
  __shared__ float red[ATTN_THREADS / 32];
  __shared__ int last;
  PdlWait wait;
  attention_body(qb, kc, vc, state, po, pml, counters, out, nh, nkv, D, cap, NS, scale, trace,
                 window, softcap, sinks, KernelIdx(), q, p, part, red, &last, wait, BlockSync());
}

// Warp-wide (max, first index) reduction; every lane gets the result.
// Greedy sampling as mlx-lm samples: the first index of the largest log-probability
// (logits - logsumexp(logits), both rounded to bfloat16 as MLX computes them in the logits'
// dtype) becomes the next token; the state advances one position. Two kernels of G blocks of
// ARGMAX_THREADS threads, block b over logits [b ARGMAX_SLICE, (b + 1) ARGMAX_SLICE), each
// thread's ARGMAX_PER values loaded at once:
// - argmax_partial: each block's maximum m_b and sum s_b of e^(v - m_b) go to part[2 b]; the
//   last block to finish (counted in ctl[0]) combines them into lse = logsumexp (bfloat16)
//   and the largest log-probability, part[2 G] and part[2 G + 1];
// - argmax_pick: each block's first index whose log-probability is the largest (the largest
//   log-probability is that of the largest logit: rounding is monotonic), kept in ctl[2] as
//   V - index (atomicMax: the first index wins; 0 for none); the last block (ctl[1]) writes the
//   token and advances the state, and resets ctl.
#define ARGMAX_THREADS 256
#define ARGMAX_PER 8
#define ARGMAX_SLICE (ARGMAX_THREADS * ARGMAX_PER)

// Block-wide sum (every thread gets it), in a fixed order: lanes, then warps in turn.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = 0.f;
  for (int i = 0; i < ARGMAX_THREADS / 32; ++i) t += red[i];
  __syncthreads();
  return t;
}

__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = NEG_INF;
  for (int i = 0; i < ARGMAX_THREADS / 32; ++i) t = fmaxf(t, red[i]);
  __syncthreads();
  return t;
}

// The thread's values of its block's slice (-inf past V: adds nothing to a sum of
// exponentials, never the maximum, never picked), each plus the row's logit bias (a
// bfloat16 value; zero where none is set), the sum rounded to bfloat16, as mlx-lm's
// logit_bias processor adds it to the bfloat16 logits (x + 0 is x: a row without a bias
// reads its logits).
__device__ __forceinline__ void argmax_load(const float* logits, const float* bias, ll V,
                                            float* v, ll bx, unsigned t) {
  const ll base = bx * ARGMAX_SLICE + t;
#pragma unroll
  for (int k = 0; k < ARGMAX_PER; ++k) {
    const ll i = base + k * ARGMAX_THREADS;
    v[k] = i < V ? rbf(__ldcg(logits + i) + __ldcg(bias + i)) : NEG_INF;
  }
}

// argmax_partial's body (the kernel below; the persistent step's phases): block
// (ix.x(), ix.y()) of a grid of ix.gx() by NB, its shared memory and wait passed in.
template <class Wait, class Idx>
__device__ __forceinline__ void argmax_partial_body(const float* logits, const float* bias,
                                                    float* part, int* ctl, ll V, float* red,
                                                    int* last_p, Idx ix, Wait& wait) {
  int& last = *last_p;
  wait();
  const int tid = ix.t();
  const ll G = ix.gx();
  // Block (x, b): sequence b's logits, parts and counters (grid G by NB).
  const ll row = ix.y();
  logits += row * V;
  bias += row * V;
  part += row * (2 * G + 2);
  ctl += row * 4;
  float v[ARGMAX_PER];
  argmax_load(logits, bias, V, v, ix.x(), ix.ut());
  float m = NEG_INF;
#pragma unroll
  for (int k = 0; k < ARGMAX_PER; ++k) m = v[k] > m ? v[k] : m;
  m = block_max(m, red);
  float s = 0.f;
  if (m > NEG_INF) {
#pragma unroll
    for (int k = 0; k < ARGMAX_PER; ++k) s += expf(v[k] - m);
  }
  s = block_sum(s, red);
  if (tid == 0) {
    part[2 * ix.ux()] = m;
    part[2 * ix.ux() + 1] = s;
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(&ctl[0], 1) == (int)(G - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  float M = NEG_INF;
  for (ll b = tid; b < G; b += ARGMAX_THREADS) M = fmaxf(M, __ldcg(&part[2 * b]));
  M = block_max(M, red);
  float tot = 0.f;
  if (M > NEG_INF) {
    for (ll b = tid; b < G; b += ARGMAX_THREADS) {
      const float mb = __ldcg(&part[2 * b]);
      if (mb > NEG_INF) tot += __ldcg(&part[2 * b + 1]) * expf(mb - M);
    }
  }
  tot = block_sum(tot, red);
  if (tid == 0) {
    const float lse = rbf(logf(tot) + M);
    part[2 * G] = lse;
    part[2 * G + 1] = rbf(M - lse);
    ctl[0] = 0;
  }
}
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS) argmax_partial(
    const float* logits, const float* bias, float* part, int* ctl, ll V) {
  __shared__ float red[ARGMAX_THREADS / 32];
  __shared__ int last;
  PdlWait wait;
  argmax_partial_body(logits, bias, part, ctl, V, red, &last, KernelIdx(), wait);
}

// argmax_pick's body (the kernel below; the persistent step's last phase): block
// (ix.x(), ix.y()) of a grid of ix.gx() by NB, its shared memory and wait passed in.
template <class Wait, class Idx>
__device__ __forceinline__ void argmax_pick_body(const float* logits, const float* bias,
                                                 const float* part, int* ctl, int* state,
                                                 int* tokens, ll V, ll max_steps, int* red,
                                                 int* last_p, Idx ix, Wait& wait) {
  int& last = *last_p;
  const int tid = ix.t(), lane = tid & 31, warp = tid >> 5;
  const ll G = ix.gx();
  const ll row = ix.y();
  logits += row * V;
  bias += row * V;
  part += row * (2 * G + 2);
  ctl += row * 4;
  state += 4 * row;
  tokens += row * 2 * max_steps;
  // The logits were written two kernels back: loaded before the wait (see attention).
  float v[ARGMAX_PER];
  argmax_load(logits, bias, V, v, ix.x(), ix.ut());
  wait();
  // An idle row samples nothing (its state is the host's: read after the wait).
  if (state[1] < 0) return;
  const float lse = __ldcg(&part[2 * G]), best = __ldcg(&part[2 * G + 1]);
  // V - the thread's first index whose log-probability is the largest, or 0.
  int mine = 0;
  const ll base = ix.x() * ARGMAX_SLICE + tid;
#pragma unroll
  for (int k = ARGMAX_PER - 1; k >= 0; --k) {
    if (rbf(v[k] - lse) == best) mine = (int)(V - (base + k * ARGMAX_THREADS));
  }
  for (int o = 16; o > 0; o >>= 1) {
    const int other = __shfl_xor_sync(0xffffffffu, mine, o);
    mine = other > mine ? other : mine;
  }
  if (lane == 0) red[warp] = mine;
  __syncthreads();
  if (tid == 0) {
    int b = 0;
    for (int i = 0; i < ARGMAX_THREADS / 32; ++i) b = red[i] > b ? red[i] : b;
    if (b > 0) atomicMax(&ctl[2], b);
    __threadfence();
    last = atomicAdd(&ctl[1], 1) == (int)(G - 1);
  }
  __syncthreads();
  if (!last || tid != 0) return;
  __threadfence();
  const int found = atomicExch(&ctl[2], 0);
  const int idx = found > 0 ? (int)(V - found) : 0;
  ctl[1] = 0;
  const int step = state[2];
  // The token and its log-probability (the largest), side by side.
  if (step < max_steps) {
    tokens[2 * step] = idx;
    tokens[2 * step + 1] = (int)__float_as_uint(best);
  }
  state[0] = idx;
  state[1] += 1;
  state[2] = step + 1;
}
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS) argmax_pick(
    const float* logits, const float* bias, const float* part, int* ctl, int* state,
    int* tokens, ll V, ll max_steps) {
  __shared__ int red[ARGMAX_THREADS / 32];
  __shared__ int last;
  PdlWait wait;
  argmax_pick_body(logits, bias, part, ctl, state, tokens, V, max_steps, red, &last, KernelIdx(),
                   wait);
}

// The persistent step (GRAPH_PERSIST 1: the host's MLX_GRAPH_PERSIST=1, one-row FFMA steps of
// the llama family): one launch runs a whole step (embed, each layer's row and attention
// kernels, the head, the argmax pair) as phases of one grid of co-resident blocks (the SMs
// times the blocks an SM holds), in the order record_step launches them. Phase i is the table
// row ph[i] (PS_WORDS words: the kernel, its grid's x and y, then its arguments as the kernel
// takes them); a grid barrier (ps_barrier) stands where the kernel's blocks wait for the one
// before (pdl_wait_then_release), so each phase's weights load before it as with PDL. A row
// phase (matvec, matvec_qkv, matvec_attn_out) runs the kernel's body over this grid (the
// groups of rows stride over its warps; each group is summed whole by one warp: the same bits
// whatever the grid); an attention phase runs the kernel's 128-thread blocks as the virtual
// blocks of the half blocks (2 blockIdx.x + half, then + 2 gridDim.x), each half with its own
// shared memory and barrier. Every output is the kernels' own, bit for bit.
#ifndef GRAPH_PERSIST
#define GRAPH_PERSIST 0
#endif
#if GRAPH_PERSIST
#if MV_MMA || NB != 1 || ATTN_SINKS || MV_OUT_BIAS
#error "the persistent step runs one-row FFMA steps"
#endif
#define PS_WORDS 32
// The persistent step's blocks an SM (its registers: 255 at one block, no spills).
#ifndef PS_MIN_BLOCKS
#define PS_MIN_BLOCKS 1
#endif
// The grid barrier's ordering: 0, fences around a relaxed atomic (as cooperative groups' grid
// sync); 1, a release atomic and acquire polls (MLX_GRAPH_PERSIST=2, for A/B).
#ifndef PS_BARRIER_RA
#define PS_BARRIER_RA 0
#endif
// The phases' kernels (the emulator's numbers for them).
#define PS_EMBED 0
#define PS_ARGMAX_PARTIAL 4
#define PS_ARGMAX_PICK 5
#define PS_MATVEC 1
#define PS_QKV 2
#define PS_ATTENTION 3
#define PS_ATTN_OUT 11
// A half block's attention shared memory in floats: q[128], p[ATTN_CHUNK], part[8 x 128],
// red[4], last (and 3 to keep 16 bytes).
#define PS_ATTN_FLOATS (128 + ATTN_CHUNK + 8 * ATTN_THREADS + ATTN_THREADS / 32 + 4)

// The trace (the host's MLX_GRAPH_PERSIST_TRACE: a non-null `trace`): thread 0 of every block
// notes, for each phase, %globaltimer and clock64 at the phase's entry (before its function is
// called), at its barrier's arrival and at its departure, into the step's trace (PS_TW words a
// phase and block, [phase][block]: entry, arrival, departure, SM, then the three clock64
// values; a last row's entry is the step's end). Only thread 0 writes it, only the trace: the
// same bits. A runtime switch (a null trace writes nothing), so that a traced run and an
// untraced one share their compiled source; PS_TRACE 0 compiles it out.
#ifndef PS_TRACE
#define PS_TRACE 1
#endif
// PS_SPLIT (MLX_GRAPH_PERSIST_SPLIT=1): the grid barrier in two: a block arrives as soon as its
// phase's work is done (at the end of the phase's function, before its saved registers are
// restored), and waits where the kernel's blocks wait (after the next phase's early loads): the
// return, the next phase's table row, call and early loads overlap the barrier instead of
// preceding the arrival.
#ifndef PS_SPLIT
#define PS_SPLIT 0
#endif
// PS_POLL_RELAXED (MLX_GRAPH_PERSIST_POLL=1): the barrier's polls are relaxed loads; after the
// last, one acquire load (PS_BARRIER_RA) or the fence already there (without it), instead of an
// acquire load a poll.
#ifndef PS_POLL_RELAXED
#define PS_POLL_RELAXED 0
#endif
// PS_SMEM_TABLE (MLX_GRAPH_PERSIST_SMEM=1): each block copies the table and each phase's
// function into its shared memory when the step begins (past the attention halves': n
// (PS_WORDS + 1) words), so that a phase's call and arguments are shared-memory reads instead of
// a chain of dependent global loads (its kind, its function, then its arguments) after the
// previous phase.
#ifndef PS_SMEM_TABLE
#define PS_SMEM_TABLE 0
#endif
// PS_LOOP (MLX_GRAPH_PERSIST_LOOP=1): the step as a layer loop with each phase's body inlined in
// its fixed place (embed; a layer: q/k/v, attention, then its three row products, the last
// layer's four with the head; the argmax pair), instead of a loop that calls each phase through
// the table of functions (ps_phases): no call, no ABI saves and restores, no marshalling. Only
// for the step of that shape (the host checks the phases' kinds: persist_loop_shape); each
// phase's arguments are read from its row inside the phase (volatile loads: not hoisted across
// phases, not kept live across the loop), so that each body is allocated on its own.
#ifndef PS_LOOP
#define PS_LOOP 0
#endif
#define PS_TW 8

__device__ __forceinline__ u64 ps_load_acquire(const u64* p) {
#ifdef __CUDA_ARCH__
  u64 v;
#if PS_POLL_RELAXED
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
#else
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
#endif
  return v;
#else
  return __atomic_load_n(p, PS_POLL_RELAXED ? __ATOMIC_RELAXED : __ATOMIC_ACQUIRE);
#endif
}

// One acquire load of the counter (PS_POLL_RELAXED with the release/acquire barrier: after the
// relaxed polls).
__device__ __forceinline__ void ps_acquire_once(const u64* p) {
#ifdef __CUDA_ARCH__
  u64 v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  (void)v;
#else
  (void)__atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

// Adds 1 to the counter with release semantics (PS_BARRIER_RA's arrival: no separate fence).
__device__ __forceinline__ u64 ps_add_release(u64* p) {
#ifdef __CUDA_ARCH__
  u64 old;
  asm volatile("atom.add.release.gpu.global.u64 %0, [%1], 1;" : "=l"(old) : "l"(p) : "memory");
  return old;
#else
  return __atomic_fetch_add(p, 1ull, __ATOMIC_RELEASE);
#endif
}

// The same with acquire too (PS_SPLIT's arrival with PS_BARRIER_RA: the block whose arrival
// completes the barrier does not poll, its arrival is its acquire).
__device__ __forceinline__ u64 ps_add_acq_rel(u64* p) {
#ifdef __CUDA_ARCH__
  u64 old;
  asm volatile("atom.add.acq_rel.gpu.global.u64 %0, [%1], 1;" : "=l"(old) : "l"(p) : "memory");
  return old;
#else
  return __atomic_fetch_add(p, 1ull, __ATOMIC_ACQ_REL);
#endif
}

// PS_SPLIT: a target's bit 63 says the block's own arrival completed the barrier.
#define PS_LAST (1ull << 63)

__device__ __forceinline__ u64 ps_clock() {
#ifdef __CUDA_ARCH__
  return (u64)clock64();
#else
  return 0;
#endif
}

// The trace's time `which` (0 entry, 1 arrival, 2 departure) of this block's slot (thread 0).
__device__ __forceinline__ void ps_mark(u64* slot, int which) {
#if PS_TRACE
  if (slot) {
    slot[which] = gtime();
    slot[4 + which] = ps_clock();
    if (which == 0) slot[3] = sm_id();
  }
#endif
}

// The barrier of half `half` of the block (threads 128 half ..): named barrier 1 + half.
__device__ __forceinline__ void ps_half_sync(int half) {
#ifdef __CUDA_ARCH__
  asm volatile("bar.sync %0, 128;" ::"r"(half + 1) : "memory");
#else
  emu_half_sync(half);
#endif
}

// The block's barrier (bar.sync 0 over its 256 threads) from wherever each warp calls it: an
// attention phase's halves call it from their own code (each exactly once a phase).
__device__ __forceinline__ void ps_block_sync() {
#ifdef __CUDA_ARCH__
  asm volatile("bar.sync 0;" ::: "memory");
#else
  __syncthreads();
#endif
}

// The grid barrier's arrival: the block's threads meet, thread 0 makes their writes visible
// (fence) and adds 1 to the counter; returns (thread 0's) the next multiple of gridDim.x, which
// the counter reaches when every block has arrived (the counter only grows, across phases and
// steps, so no reset). PS_SPLIT: `prev`, the block's previous target in this launch (0: none),
// gives it without a 64-bit division (prev + gridDim.x: each block arrives once a barrier),
// and the arrival that completes the barrier marks its target PS_LAST (its wait does not
// poll; with PS_BARRIER_RA the arrival is acquire and release).
__device__ __forceinline__ u64 ps_arrive(u64* ctr, u64* slot, u64 prev = 0) {
  ps_block_sync();
  u64 target = 0;
  if (threadIdx.x == 0) {
    ps_mark(slot, 1);
    const u64 units = gridDim.x;
#if PS_BARRIER_RA && PS_SPLIT
    const u64 old = ps_add_acq_rel(ctr);
#elif PS_BARRIER_RA
    // Release/acquire alone (MLX_GRAPH_PERSIST=2): the arrival's release orders the block's
    // writes (made the thread's by the block barrier) before it, the polls' acquire the
    // phase's reads after them; no fence.sc on either side.
    const u64 old = ps_add_release(ctr);
#else
    __threadfence();
    const u64 old = atomicAdd(ctr, 1ull);
#endif
#if PS_SPLIT
    target = prev ? (prev & ~PS_LAST) + units : (old / units + 1) * units;
    if (old + 1 == target) target |= PS_LAST;
#else
    (void)prev;
    target = (old / units + 1) * units;
#endif
  }
  return target;
}

// The grid barrier's wait: thread 0 polls the counter until it reaches `tgt` (every block
// arrived; PS_LAST: it has), and the block meets again.
__device__ __forceinline__ void ps_wait(const u64* ctr, u64 tgt, u64* slot) {
  if (threadIdx.x == 0) {
    const u64 target = tgt & ~PS_LAST;
    // A grid whose blocks are not all resident (the host sizes it from the occupancy API; a
    // GPU shared with another context could hold fewer) would wait forever: past 2^24 polls
    // (~10 s at an L2 round trip a poll; a phase takes microseconds) the kernel traps
    // instead of hanging: a sticky CUDA error that poisons the process's CUDA context (the
    // MLX path's included), not only the decoder. A cooperative launch, which fails cleanly
    // where the blocks cannot all be resident, is what would let the engine fall back.
#if PS_SPLIT
    if (!(tgt & PS_LAST))
#endif
    {
      for (u32 polls = 0; ps_load_acquire(ctr) < target; ++polls) {
        if (polls == (1u << 24)) __trap();
#ifndef __CUDA_ARCH__
        emu_yield();
#endif
      }
#if PS_BARRIER_RA && PS_POLL_RELAXED
      ps_acquire_once(ctr);
#endif
    }
#if !PS_BARRIER_RA
    __threadfence();
#endif
    ps_mark(slot, 2);
  }
  ps_block_sync();
}

// The grid barrier: arrival and wait at once. `first` (the step's first phase): the blocks
// wait for the kernel before this one (embed) first.
__device__ __forceinline__ void ps_barrier(u64* ctr, bool first, u64* slot) {
  if (first) pdl_wait_then_release();
  const u64 target = ps_arrive(ctr, slot);
  ps_wait(ctr, target, slot);
}

// A phase's barrier as its function sees it: the counter, the target its block's arrival set
// (PS_SPLIT: at the end of the phase before), whether it is the step's first and last phase,
// and the block's trace slot for it (null: no trace).
struct PsBar {
  u64* ctr;
  u64 target;
  bool first, last;
  u64* slot;
  // A phase function's: `flags` bit 0, the step's first phase; bit 1, its last.
  __device__ __forceinline__ PsBar(u64* c, u64 t, int flags, u64* s)
      : ctr(c), target(t), first((flags & 1) != 0), last((flags & 2) != 0), slot(s) {}
  // Where the kernel's blocks wait for the kernel before.
  __device__ __forceinline__ void wait() const {
#if PS_SPLIT
    ps_wait(ctr, target, slot);
#else
    ps_barrier(ctr, first, slot);
#endif
  }
  // The end of the phase's work (every thread of the block): PS_SPLIT, the next phase's
  // arrival (none after the last), its target; else nothing.
  __device__ __forceinline__ u64 done() const {
#if PS_SPLIT
    if (last) return 0;
    return ps_arrive(ctr, slot ? slot + (ll)gridDim.x * PS_TW : nullptr, target);
#else
    return 0;
#endif
  }
};

// A row phase's wait: every thread of the block calls it once.
struct PsWait {
  const PsBar* b;
  __device__ __forceinline__ void operator()() const { b->wait(); }
};
// An attention phase's, a half block's: its first virtual block's call, or after its last.
struct PsWaitOnce {
  const PsBar* b;
  bool done;
  __device__ __forceinline__ void operator()() {
    if (!done) {
      done = true;
      b->wait();
    }
  }
};
// An attention phase's virtual block (bx, by) and thread of its 128.
struct PsIdx {
  ll bx, by;
  int tid;
  ll gridx;
  __device__ __forceinline__ ll x() const { return bx; }
  __device__ __forceinline__ ll y() const { return by; }
  __device__ __forceinline__ int t() const { return tid; }
  __device__ __forceinline__ unsigned ux() const { return (unsigned)bx; }
  __device__ __forceinline__ unsigned ut() const { return (unsigned)tid; }
  __device__ __forceinline__ ll gx() const { return gridx; }
};
struct PsHalfSync {
  int half;
  __device__ __forceinline__ void operator()() const { ps_half_sync(half); }
};

// A phase's row: PS_LOOP, read through a volatile pointer (each argument loaded where its
// phase uses it, never hoisted out of the layer loop).
#if PS_LOOP
typedef const volatile u64* PsRow;
#define PS_PHASE_FN __device__ __forceinline__
#else
typedef const u64* PsRow;
#define PS_PHASE_FN __device__ __noinline__
#endif
// A phase's argument i as the kernel's parameter (a pointer, an integer, a double's bits).
#define PS_P(T, i) ((T)a[3 + (i)])
#define PS_L(i) ((ll)a[3 + (i)])
#define PS_D(i) (__longlong_as_double((ll)a[3 + (i)]))
// Each phase's kernel body is a function of its own, called from the step's loop (inlined
// into the loop, the bodies' registers were allocated around the loop's back edge: ~6 KB of
// spills, some in the products' inner loops; called, each is allocated as its kernel is).
// Under PS_LOOP they are inlined in the layer loop instead (PS_PHASE_FN), spill-free there
// because PS_ZERO defines every register a body loads on some paths only.
PS_PHASE_FN u64 ps_matvec(PsRow a, unsigned char* smem, float* red, float*,
                                       u64* ctr, u64 target, int flags, u64* slot) {
  const PsBar bar{ctr, target, flags, slot};
  // matvec's (the persistent step runs FFMA steps alone: no tensor-core tiles, no matvec_norm).
  matvec_body<false>(PS_P(const void*, 0), PS_P(const void*, 1), PS_P(const bf16_t*, 2),
                     PS_P(const bf16_t*, 3), PS_P(const bf16_t*, 4), PS_P(const bf16_t*, 5),
                     PS_P(const bf16_t*, 6), PS_P(const bf16_t*, 7), PS_P(const bf16_t*, 8),
                     PS_P(void*, 9), PS_L(10), PS_L(11), PS_L(12), PS_L(13), PS_L(14), PS_D(15),
                     nullptr, PS_D(17), smem, red, PsWait{&bar});
  return bar.done();
}
PS_PHASE_FN u64 ps_qkv(PsRow a, unsigned char* smem, float* red, float*,
                                    u64* ctr, u64 target, int flags, u64* slot) {
  const PsBar bar{ctr, target, flags, slot};
  matvec_qkv_body(PS_P(const void*, 0), PS_P(const void*, 1), PS_P(const void*, 2),
                  PS_P(const bf16_t*, 3), PS_P(const bf16_t*, 4), PS_P(const bf16_t*, 5),
                  PS_P(const bf16_t*, 6), PS_P(const bf16_t*, 7), PS_P(const bf16_t*, 8),
                  PS_P(const bf16_t*, 9), PS_P(const bf16_t*, 10), PS_P(bf16_t*, 11),
                  PS_P(bf16_t*, 12), PS_P(bf16_t*, 13), PS_P(const int*, 14), PS_L(15), PS_L(16),
                  PS_L(17), PS_L(18), PS_L(19), PS_L(20), PS_L(21), PS_L(22), PS_D(23),
                  PS_P(const float*, 24), nullptr, PS_L(26), PS_P(const bf16_t*, 27), PS_L(28),
                  smem, red, PsWait{&bar});
  return bar.done();
}
PS_PHASE_FN u64 ps_attn_out(PsRow a, unsigned char* smem, float* red, float*,
                                         u64* ctr, u64 target, int flags, u64* slot) {
  const PsBar bar{ctr, target, flags, slot};
  matvec_attn_out_body(PS_P(const void*, 0), PS_P(const bf16_t*, 1), PS_P(const bf16_t*, 2),
                       PS_P(const float*, 3), PS_P(const float*, 4), PS_P(const int*, 5),
                       PS_P(const bf16_t*, 6), PS_P(bf16_t*, 7), PS_L(8), PS_L(9), PS_L(10),
                       PS_L(11), PS_L(12), PS_L(13), PS_L(14), nullptr, PS_D(16), smem, red,
                       PsWait{&bar});
  return bar.done();
}
// The table's unused kernel numbers (never a phase: persist_build refuses a step with a launch no
// phase runs). With PS_SPLIT it would arrive without waiting, its departure unwritten.
PS_PHASE_FN u64 ps_none(PsRow, unsigned char*, float*, float*, u64* ctr, u64 target, int flags, u64* slot) {
  const PsBar bar{ctr, target, flags, slot};
  return bar.done();
}
// embed and the argmax pair: the kernels' 256-thread blocks as the blocks' virtual blocks
// (blockIdx.x, + gridDim.x, ..; the grid gx by gy), then the barrier if none of them took it.
// Their shared memory: red (8 words) and last (the 9th) in the row phases' `red` (16 words).
PS_PHASE_FN u64 ps_embed(PsRow a, unsigned char*, float*, float*, u64* ctr, u64 target, int flags, u64* slot) {
  const PsBar bar{ctr, target, flags, slot};
  const ll gx = (ll)a[1], blocks = gx * (ll)a[2];
  PsWaitOnce w{&bar, false};
  for (ll vb = blockIdx.x; vb < blocks; vb += gridDim.x)
    embed_body(PS_P(const void*, 0), PS_P(const bf16_t*, 1), PS_P(const bf16_t*, 2),
               PS_P(const int*, 3), PS_P(bf16_t*, 4), PS_L(5), PS_L(6), PS_L(7), PS_P(float*, 8),
               PS_L(9), PS_L(10), PS_P(const float*, 11), PS_D(12), PS_D(13), PS_D(14), PS_L(15),
               PS_P(const float*, 16), PS_D(17), PS_D(18),
               PsIdx{vb % gx, vb / gx, (int)threadIdx.x, gx}, w);
  w();
  return bar.done();
}
PS_PHASE_FN u64 ps_argmax_partial(PsRow a, unsigned char*, float* red, float*,
                                               u64* ctr, u64 target, int flags, u64* slot) {
  const PsBar bar{ctr, target, flags, slot};
  const ll gx = (ll)a[1], blocks = gx * (ll)a[2];
  PsWaitOnce w{&bar, false};
  for (ll vb = blockIdx.x; vb < blocks; vb += gridDim.x)
    argmax_partial_body(PS_P(const float*, 0), PS_P(const float*, 1), PS_P(float*, 2),
                        PS_P(int*, 3), PS_L(4), red, (int*)(red + 8),
                        PsIdx{vb % gx, vb / gx, (int)threadIdx.x, gx}, w);
  w();
  return bar.done();
}
PS_PHASE_FN u64 ps_argmax_pick(PsRow a, unsigned char*, float* red, float*,
                                            u64* ctr, u64 target, int flags, u64* slot) {
  const PsBar bar{ctr, target, flags, slot};
  const ll gx = (ll)a[1], blocks = gx * (ll)a[2];
  PsWaitOnce w{&bar, false};
  for (ll vb = blockIdx.x; vb < blocks; vb += gridDim.x)
    argmax_pick_body(PS_P(const float*, 0), PS_P(const float*, 1), PS_P(const float*, 2),
                     PS_P(int*, 3), PS_P(int*, 4), PS_P(int*, 5), PS_L(6), PS_L(7), (int*)red,
                     (int*)(red + 8), PsIdx{vb % gx, vb / gx, (int)threadIdx.x, gx}, w);
  w();
  return bar.done();
}
// The attention kernel's blocks 2 blockIdx.x + half, + 2 gridDim.x, .. on half `half` (sm: its
// shared memory), then the barrier if none of them took it.
PS_PHASE_FN u64 ps_attention(PsRow a, unsigned char*, float*, float* sm,
                                          u64* ctr, u64 target, int flags, u64* slot) {
  const PsBar bar{ctr, target, flags, slot};
  const int half = (int)(threadIdx.x >> 7), tid = (int)(threadIdx.x & 127);
  const ll gx = (ll)a[1], blocks = gx * (ll)a[2];
  float* q = sm;
  float* p = q + 128;
  float* part = p + ATTN_CHUNK;
  float* red = part + 8 * ATTN_THREADS;
  int* last = (int*)(red + ATTN_THREADS / 32);
  PsWaitOnce w{&bar, false};
  for (ll vb = 2 * (ll)blockIdx.x + half; vb < blocks; vb += 2 * (ll)gridDim.x)
    attention_body(PS_P(const bf16_t*, 0), PS_P(const bf16_t*, 1), PS_P(const bf16_t*, 2),
                   PS_P(const int*, 3), PS_P(float*, 4), PS_P(float*, 5), PS_P(int*, 6),
                   PS_P(bf16_t*, 7), PS_L(8), PS_L(9), PS_L(10), PS_L(11), PS_L(12), PS_D(13),
                   nullptr, PS_L(15), PS_D(16), PS_P(const bf16_t*, 17),
                   PsIdx{vb % gx, vb / gx, tid, gx}, q, p, part, red, last, w, PsHalfSync{half});
  w();
  return bar.done();
}

#if !PS_LOOP
// The phases' functions by kernel number (PS_MATVEC ..), called through this table: an indirect
// call is compiled on its own, whatever the loop around it (a direct one, in the loop, was
// allocated with the loop's values: ~5 KB of spills).
typedef u64 (*PsPhaseFn)(PsRow, unsigned char*, float*, float*, u64*, u64, int, u64*);
__device__ PsPhaseFn ps_phases[16] = {ps_embed, ps_matvec,         ps_qkv,         ps_attention,
                                      ps_argmax_partial, ps_argmax_pick, ps_none, ps_none,
                                      ps_none,  ps_none,           ps_none,        ps_attn_out,
                                      ps_none,  ps_none,           ps_none,        ps_none};

// ph: n phases of PS_WORDS words; ctr: the barrier's counter (zeroed once when allocated);
// attn_at: where the attention halves' shared memory begins (the row phases' dynamic shared
// memory before it), 16-byte aligned; the block's shared memory is attn_at + 64 +
// 2 PS_ATTN_FLOATS 4 bytes (PS_SMEM_TABLE: + n (PS_WORDS + 1) 8); trace: the step's trace
// ((n + 1) gridDim.x PS_TW words), or null.
extern "C" __global__ void __launch_bounds__(256, PS_MIN_BLOCKS) persist_step(const u64* ph, ll n,
                                                                             u64* ctr,
                                                                             ll attn_at,
                                                                             u64* trace) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* red = (float*)(smem + attn_at);
  float* sm = red + 16 + (threadIdx.x >> 7) * PS_ATTN_FLOATS;
#if PS_TRACE
  // Thread 0's slot in row i: slot + i gridDim.x PS_TW.
  u64* slot = (trace && threadIdx.x == 0) ? trace + (ll)blockIdx.x * PS_TW : nullptr;
#define PS_SLOT(i) (slot ? slot + (i) * (ll)gridDim.x * PS_TW : nullptr)
#else
  (void)trace;
#define PS_SLOT(i) ((u64*)nullptr)
#endif
#if PS_SMEM_TABLE
  // The table and the phases' functions, past the attention halves' shared memory.
  u64* tab = (u64*)(smem + attn_at + 64 + 2 * PS_ATTN_FLOATS * 4);
  PsPhaseFn* fns = (PsPhaseFn*)(tab + n * PS_WORDS);
  for (ll j = threadIdx.x; j < n * PS_WORDS; j += blockDim.x) tab[j] = ph[j];
  ps_block_sync();
  for (ll j = threadIdx.x; j < n; j += blockDim.x) fns[j] = ps_phases[tab[j * PS_WORDS] & 15];
  ps_block_sync();
  const u64* table = tab;
#define PS_FN(i, a) fns[i]
#else
  const u64* table = ph;
#define PS_FN(i, a) ps_phases[(a)[0] & 15]
#endif
  u64 target = 0;
#if PS_SPLIT
  // The first phase's arrival (after the kernel before this one: the previous step's).
  if (n > 0) {
    pdl_wait_then_release();
    target = ps_arrive(ctr, PS_SLOT(0));
  }
#endif
  for (ll i = 0; i < n; ++i) {
    const u64* a = table + i * PS_WORDS;
    ps_mark(PS_SLOT(i), 0);
    target = PS_FN(i, a)(a, smem, red, sm, ctr, target,
                                  (i == 0 ? 1 : 0) | (i + 1 == n ? 2 : 0), PS_SLOT(i));
  }
  ps_mark(PS_SLOT(n), 0);
#undef PS_SLOT
#undef PS_FN
}
#else  // PS_LOOP
// The step as a layer loop (PS_LOOP; the host runs it only for this shape of table): phase 0
// embed; then `layers` layers of five phases (q/k/v, attention, three row products: o,
// gate/up, down), the last layer's row products followed by the head's (a fourth, the same
// body); then argmax_partial and argmax_pick. Each phase's body inlined once, in that order;
// the loops `#pragma unroll 1`. Nothing lives in registers from one phase to the next: the
// loops' counters and the barrier's target (thread 0's) are in shared memory (volatile: read
// where each phase begins, written where it ends), the trace slot and the attention halves'
// memory are recomputed from the launch's parameters and the (opaque) thread index a phase, so
// that each body is allocated as if it were a kernel of its own. The same arguments (ph, n,
// ctr, attn_at, trace), barrier, trace and bits as the loop over the table of functions.
// A value the compiler cannot see through (an empty asm that may change it): what a phase
// derives from it is computed in the phase, never hoisted out of the layer loop and kept live
// across the other phases.
template <class T>
__device__ __forceinline__ T ps_opaque(T v) {
#ifdef __CUDA_ARCH__
  static_assert(sizeof(T) == 8, "64-bit values");
  asm volatile("" : "+l"(v));
#endif
  return v;
}
struct PsLoopState {
  ll i, l, r, layers;
  u64 target;
};
// What the host adds to the block's shared memory for it (graph_decode.rs: PS_LOOP_STATE_BYTES).
static_assert(sizeof(PsLoopState) <= 64, "the layer loop's state: 64 bytes");
extern "C" __global__ void __launch_bounds__(256, PS_MIN_BLOCKS) persist_step(const u64* ph, ll n,
                                                                             u64* ctr,
                                                                             ll attn_at,
                                                                             u64* trace) {
  extern __shared__ __align__(16) unsigned char smem[];
  // The loop's state: past the attention halves' memory and the table (PS_SMEM_TABLE), in the
  // block's own dynamic shared memory (the host adds PS_LOOP_STATE_BYTES).
  volatile PsLoopState& st = *(PsLoopState*)(smem + attn_at + 64 + 2 * PS_ATTN_FLOATS * 4 +
                                             (PS_SMEM_TABLE ? n * PS_WORDS * 8 : 0));
#define PS_RED ((float*)(sm_ + at_))
#define PS_SM (PS_RED + 16 + (threadIdx.x >> 7) * PS_ATTN_FLOATS)
#if PS_TRACE
#define PS_SLOT(i)                                                                   \
  ((tr_ && threadIdx.x == 0) ? tr_ + ((ll)blockIdx.x + (i) * (ll)gridDim.x) * PS_TW \
                             : nullptr)
#else
  (void)trace;
#define PS_SLOT(i) ((u64*)nullptr)
#endif
#if PS_SMEM_TABLE
  u64* tab = (u64*)(smem + attn_at + 64 + 2 * PS_ATTN_FLOATS * 4);
  for (ll j = threadIdx.x; j < n * PS_WORDS; j += blockDim.x) tab[j] = ph[j];
  const PsRow table = tab;
#else
  const PsRow table = ph;
#endif
  if (n < 9 || (n - 4) % 5 != 0) return;  // not this shape (the host never launches it so)
  unsigned char* sm_ = smem;
  ll at_ = attn_at;
  u64* tr_ = trace;
  if (threadIdx.x == 0) {
    st.i = 1;
    st.l = 0;
    st.layers = (n - 4) / 5;
    st.target = 0;
  }
  ps_block_sync();
#if PS_SPLIT
  pdl_wait_then_release();
  {
    const u64 t = ps_arrive(ctr, PS_SLOT(0));
    if (threadIdx.x == 0) st.target = t;
  }
#endif
  // Phase j of kind FN at row j: its entry mark, its body, its target (thread 0's) kept; the
  // launch's values made opaque first (each phase derives its own from them).
#define PS_RUN(FN, j, flags)                                                                \
  {                                                                                         \
    sm_ = ps_opaque(sm_);                                                                   \
    at_ = ps_opaque(at_);                                                                   \
    tr_ = ps_opaque(tr_);                                                                   \
    const ll j_ = (j);                                                                      \
    ps_mark(PS_SLOT(j_), 0);                                                                \
    const u64 t_ = FN(table + j_ * PS_WORDS, sm_, PS_RED, PS_SM, ps_opaque(ctr),            \
                      threadIdx.x == 0 ? st.target : 0, flags, PS_SLOT(j_));               \
    if (threadIdx.x == 0) st.target = t_;                                                   \
  }
  PS_RUN(ps_embed, 0, 1)
#pragma unroll 1
  while (st.l < st.layers) {
    PS_RUN(ps_qkv, st.i, 0)
    PS_RUN(ps_attention, st.i + 1, 0)
    // Every thread has read st.i above (before the phases' barriers): thread 0 moves it on.
    if (threadIdx.x == 0) {
      st.i = st.i + 2;
      st.r = st.l + 1 == st.layers ? 4 : 3;
    }
    ps_block_sync();
#pragma unroll 1
    while (st.r > 0) {
      PS_RUN(ps_matvec, st.i, 0)
      ps_block_sync();
      if (threadIdx.x == 0) {
        st.i = st.i + 1;
        st.r = st.r - 1;
      }
      ps_block_sync();
    }
    if (threadIdx.x == 0) st.l = st.l + 1;
    ps_block_sync();
  }
  PS_RUN(ps_argmax_partial, n - 2, 0)
  PS_RUN(ps_argmax_pick, n - 1, 2)
  ps_mark(PS_SLOT(n), 0);
#undef PS_RUN
#undef PS_SLOT
#undef PS_RED
#undef PS_SM
}
#endif  // PS_LOOP
#undef PS_P
#undef PS_L
#undef PS_D

// Writes one phase of the persistent step's table (row: PS_WORDS words): the kernel, its grid,
// and its arguments as the launcher resolved them (buffers as device addresses; doubles as
// their bits). Launched once a phase when the decoder is built, before the step is captured.
extern "C" __global__ void persist_fill(u64* row, u64 kind, u64 gx, u64 gy, u64 a0, u64 a1,
                                        u64 a2, u64 a3, u64 a4, u64 a5, u64 a6, u64 a7, u64 a8,
                                        u64 a9, u64 a10, u64 a11, u64 a12, u64 a13, u64 a14,
                                        u64 a15, u64 a16, u64 a17, u64 a18, u64 a19, u64 a20,
                                        u64 a21, u64 a22, u64 a23, u64 a24, u64 a25, u64 a26,
                                        u64 a27, u64 a28) {
  const u64 v[PS_WORDS] = {kind, gx,  gy,  a0,  a1,  a2,  a3,  a4,  a5,  a6,  a7,
                           a8,   a9,  a10, a11, a12, a13, a14, a15, a16, a17, a18,
                           a19,  a20, a21, a22, a23, a24, a25, a26, a27, a28};
  if (threadIdx.x < PS_WORDS) row[threadIdx.x] = v[threadIdx.x];
}
#endif  // GRAPH_PERSIST
