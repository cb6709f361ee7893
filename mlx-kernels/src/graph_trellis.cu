// Trellis-coded linears (`"mode": "trellis"`; the format is mlx_core::cpu::trellis's module
// doc): appended to graph_decode.cu's source (it uses that file's bfloat16 helpers, warp_sum,
// pdl_wait_then_release and CODE_EXP) for a model with trellis weights. A linear
// y = su * H_r (Wt (H_c (sv * x))) is three launches:
// - trellis_input: xh = H_c (sv * x) in float32 (x the bfloat16 input, or rms_norm of it,
//   rounded as MLX's fast.rms_norm rounds it): one block per Hadamard block of the input;
// - trellis_matvec: z = Wt xh, the weights decoded in registers inside the dot product;
// - trellis_output: y = su * H_r z, rounded to bfloat16 as MLX rounds the linear's output,
//   then the following op (bias, residual add, SwiGLU with the gate's output, or float32).
// trellis_decode writes the decoded matrix (scale * code per weight), the device twin of
// cpu::trellis::decode_row, bit for bit. Six codes: 1mad (computed per weight), 1mad8 (the
// 1MAD integer rounded to int8; at L 8 the product reads it from a table in shared memory,
// trellis_lut_fill), 1mad8h (1mad8's code of an L-bit state's hashed 8-bit index, the
// state's top byte plus its bottom byte mod 256, L 9..=16; at L 12 the product reads the same
// table), and the S-box codes 1mad8s, gauss8s and gauss7s (the index the AES S-box of the top
// byte plus the bottom byte, mod 256, into 1mad8's codes, GAUSS8_TABLE, or GAUSS7_TABLE at its
// low 7 bits; at L 12 the product reads the S-box and the code from tables in shared memory,
// trellis_lut_fill), the code carried in the kernels' L argument (TRELLIS_CODE_SHIFT).
//
// Tiers (xtask/gpu/trellis_emulate.py runs this source as C++ on the CPU against the Rust
// references): trellis_decode, trellis_input (no norm) and trellis_output are L2, bit-exact
// against cpu::trellis::decode_row and fwht_blocks (the butterflies are the portable loop's,
// each element's adds in the same order, the 1 / sqrt(block) factor passed from the host);
// trellis_matvec sums in its own order (lanes, then a warp tree), so it is L3 against the
// float64 product of the decoded matrix, with a rounding-error bound written in the check, and
// L2 on small integer inputs (exact sums, so every order gives the same bits).

// 1MAD's constants (cpu::trellis::MAD_A, MAD_B, MAD_SCALE).
#define TRELLIS_MAD_A 34038481u
#define TRELLIS_MAD_B 76625530u
#define TRELLIS_MAD_SCALE 147.800537109375f
// 1mad8's divisor (cpu::trellis::MAD8_SCALE: MAD_SCALE * 127 / 510 in float32).
#define TRELLIS_MAD8_SCALE 36.805233001708984f
// The kernels' `L` argument carries the code above the state's bits: L | code << 8, code 0
// for 1mad, 1 for 1mad8, 2 for 1mad8h, 3 for 1mad8s, 4 for gauss8s and 5 for gauss7s
// (graph_trellis.rs, l_arg).
#define TRELLIS_CODE_SHIFT 8
// 1mad8's fast paths (L 8) read each code from a table of the 256 states' float32 codes in
// shared memory, 32 copies side by side (state s, copy j at s * 32 + j; lane j reads copy j:
// every lane its own bank, whatever the states), before the padded input (trellis_lut);
// 1mad8h's (L 12) read the same table at each state's hashed index (trellis_mad8h_index).
#define TRELLIS_LUT_FLOATS 8192
// gauss8s's and gauss7s's divisors (cpu::trellis::GAUSS8_SCALE, GAUSS7_SCALE).
#define TRELLIS_GAUSS8_SCALE 41.91534423828125f
#define TRELLIS_GAUSS7_SCALE 43.402862548828125f
// The largest Hadamard block the transforms take (hadamard_block's cap), float32 in shared
// memory.
#define TRELLIS_MAX_HB 4096
#define TRELLIS_THREADS 256
// Blocks an SM holds of trellis_qkv, trellis_matvec and trellis_matvec_in: 64 registers a
// thread (they would otherwise take ~80 and cost the SM its fourth block, a quarter of the
// warps that keep the weights' loads in flight; the other product kernels fit 64 by
// themselves).
#define TRELLIS_MIN_BLOCKS 4
// Threads a block of the decoder's fused kernels (trellis_linear, trellis_qkv, trellis_gate_up):
// TRELLIS_THREADS, or 512 or 1024 with MLX_GRAPH_TRELLIS_THREADS (graph_trellis.rs,
// trellis_source; the device's A/B, off by default). Each block stages the whole transformed
// input (norm, signs, Hadamard blocks) and fills its tables before its rows: at 1024 an SM
// holds one block, which does that once for 32 warps instead of once a block of 8 (the input
// read from L2 a quarter as often, the transform's butterflies and the tables' stores spread
// over four times the threads), and the shapes whose tables and input took an SM's shared
// memory for two or three blocks of 8 warps (gauss7s, a 14336-wide input) keep 32 warps. The
// rows, the norm's reduction (trellis_inv_rms: TRELLIS_THREADS' partition whatever the block),
// the transforms and the epilogues' arithmetic are the same: the same bits.
#ifndef TRELLIS_FUSED_THREADS
#define TRELLIS_FUSED_THREADS TRELLIS_THREADS
#endif
#define TRELLIS_FUSED_MIN_BLOCKS (TRELLIS_MIN_BLOCKS * TRELLIS_THREADS / TRELLIS_FUSED_THREADS)
// 1: trellis_qkv on a flat grid, its slices' blocks in proportion to their rows (graph_trellis.rs
// qkv_flat: MLX_GRAPH_TRELLIS_SPLIT=1, or fused blocks wider than TRELLIS_THREADS). 0: three
// equal slices, gridDim.z (the kernel as before).
#ifndef TRELLIS_QKV_FLAT
#define TRELLIS_QKV_FLAT 0
#endif
// 0 turns the L2 prefetches before the PDL wait off (trellis_prefetch, trellis_prefetch_span:
// hints, no result depends on them): MLX_GRAPH_TRELLIS_PREFETCH=0, the device's A/B of them
// (graph_trellis.rs, trellis_source).
#ifndef TRELLIS_PREFETCH
#define TRELLIS_PREFETCH 1
#endif
// 1 runs 1mad8's table path two rows a lane (trellis_row2: each input pair loaded once for
// both; the same bits): MLX_GRAPH_TRELLIS_ROWS2=1, the device's A/B of it (graph_trellis.rs,
// trellis_source). Off by default: it takes trellis_linear, trellis_gate_up and
// trellis_matvec_out to 80 registers and trellis_qkv to spills, for 1mad models too.
#ifndef TRELLIS_ROWS2
#define TRELLIS_ROWS2 0
#endif
// 1 puts the output transform's Hadamard buffer of the kernels with it in their epilogue
// (trellis_linear, trellis_matvec_out, trellis_qkv, trellis_gate_up) at the start of the
// dynamic shared memory (trellis_epilogue_buf), over the tables and the input, which the
// product no longer reads by then, instead of a static TRELLIS_MAX_HB floats: 16 KiB less a
// block, so an SM holds one block more where shared memory bounds it (an 8B layer's input of
// 4096: 3 blocks of trellis_linear -> 4, gauss7s's 2 -> 3; its down projection's 14336 at
// gauss7s 1 -> 2). The host sizes the dynamic memory to hold the output's Hadamard block
// (graph_trellis.rs, epilogue_shared_bytes). The same arithmetic in the same order: the same
// bits. MLX_GRAPH_TRELLIS_ALIAS=1 (graph_trellis.rs, trellis_source), the device's A/B of it.
#ifndef TRELLIS_ALIAS
#define TRELLIS_ALIAS 0
#endif
// 1 asks L2 for a lane's next block of words before it loads the current one (trellis_row: a
// prefetch, a hint; no result depends on it, no register is held for it): the product's loop
// waits on each block's load, which streams from DRAM in a decode step (the kernel test's
// timings read the matrix from L2). Holding the next block's words in registers instead took
// trellis_linear and trellis_gate_up to 103-104 registers and trellis_qkv to spills in its
// product loops (NVRTC sm_90, results/gpu/2026-12-06-s36-trellover). MLX_GRAPH_TRELLIS_PIPE=1
// (graph_trellis.rs, trellis_source), the device's A/B of it.
#ifndef TRELLIS_PIPE
#define TRELLIS_PIPE 0
#endif
// 1 reads the S-box codes' (1mad8s, gauss8s, gauss7s) fast paths (L 12, blocks of 32 or 64) from
// one table of every 12-bit state's code instead of the S-box then the code's table: one
// shared-memory load a weight instead of two (trellis_block's LUT 5). The 4,096 codes are bytes
// (the integer code + 128), four states a word (word s >> 2, byte s & 3), 32 copies of each word
// side by side (word q copy j at q * 32 + j: lane j reads copy j, its own bank, whatever the
// states): TRELLIS_STATE_WORDS words, 128 KiB (trellis_lut_fill). A weight: the window's shift
// puts the state at bits 5..16, one LOP3 masks s >> 2 at bits 7..16 and ors the lane in, one
// load; its byte s & 3 into a float's low mantissa under 2^23 (one PRMT with 0x4B000000, its
// selector one LOP3 from the state's bits 5..6) and one add takes 2^23 + 128 off: the same
// integer-valued code, the same FMAs in the same order, so the same bits as LUT 3 and 4. It
// trades the S-box's wavefront for ~2 instructions a weight more (9.5-9.8 against 7.8-7.9,
// NVRTC sm_90; ptxas rematerialises the selector's mask every weight): the S-box loop is bound
// by the shared-memory pipe (3 wavefronts a warp-weight: S-box, code, input), this one by issue
// (2.4 clocks a warp-weight against 3.0; results/gpu/2026-12-06-s37-trelprod). 128 KiB of
// tables leave an SM one block: meant with the 1,024-thread fused blocks (the default;
// MLX_GRAPH_TRELLIS_THREADS). MLX_GRAPH_TRELLIS_STATES=1 (graph_trellis.rs, trellis_source and
// lut_floats), the device's A/B of it.
#ifndef TRELLIS_STATES
#define TRELLIS_STATES 0
#endif
#define TRELLIS_STATE_WORDS 32768
// 1 makes trellis_row take a lane's blocks two at a time, both blocks' words loaded before
// either's codes: at the 8B's 4,096-wide rows and 32 lanes a row a lane has two blocks, whose
// loads then overlap instead of each waiting its own latency after the other's codes. The same
// blocks summed in the same order: the same bits. BW words more live a lane (6 at 3 bits,
// blocks of 64). MLX_GRAPH_TRELLIS_PAIR=1 (graph_trellis.rs, trellis_source), the device's A/B.
#ifndef TRELLIS_PAIR
#define TRELLIS_PAIR 0
#endif

// The 1MAD code of a state, as the integer byte sum minus 510, as a float (exact: |c| <= 510).
// The byte sum is one dp4a against ones, accumulated onto the bits of 2^23 (the sum is below
// 2^23, so adding is or-ing it into the mantissa), and one add takes 2^23 + 510 off: three
// instructions with the multiply-add, no conversion (I2F issues at a fraction of FFMA's rate).
__device__ __forceinline__ float trellis_code(u32 state) {
  const u32 x = state * TRELLIS_MAD_A + TRELLIS_MAD_B;
  return __uint_as_float(__dp4a(x, 0x01010101u, CODE_EXP)) - (CODE_OFF + 510.f);
}

// 1mad8's integer code of a state (TrellisCode::Mad8's int): the 1MAD integer c = byte sum -
// 510 rounded to c * 127 / 510 half away from zero (in -127..=127).
__device__ __forceinline__ int trellis_mad8_int(u32 state) {
  const u32 x = state * TRELLIS_MAD_A + TRELLIS_MAD_B;
  const u32 y = (x & 0x00FF00FFu) + ((x >> 8) & 0x00FF00FFu);
  const int c = (int)((y & 0xFFFFu) + (y >> 16)) - 510;
  const int r = ((c < 0 ? -c : c) * 127 + 255) / 510;
  return c < 0 ? -r : r;
}

// 1mad8h's table index of an L-bit state (L 9..=16; cpu::trellis::mad8h_index): its top 8
// bits plus its low 8 bits, mod 256. The state's code is 1mad8's code of the index.
__device__ __forceinline__ u32 trellis_mad8h_index(u32 state, int L) {
  return ((state >> (L - 8)) + state) & 0xFFu;
}

// The AES S-box (cpu::trellis::SBOX) and the stratified Gaussian tables (GAUSS8_TABLE,
// GAUSS7_TABLE) of the S-box codes, as the CPU's constants (graph_trellis.rs's test reads
// them back from this source). The general path and trellis_decode read them from global
// memory (through L1); the table paths from their copies in shared memory (trellis_lut_fill).
static __device__ const unsigned char TRELLIS_SBOX[256] = {
  99, 124, 119, 123, 242, 107, 111, 197, 48, 1, 103, 43, 254, 215, 171, 118,
  202, 130, 201, 125, 250, 89, 71, 240, 173, 212, 162, 175, 156, 164, 114, 192,
  183, 253, 147, 38, 54, 63, 247, 204, 52, 165, 229, 241, 113, 216, 49, 21,
  4, 199, 35, 195, 24, 150, 5, 154, 7, 18, 128, 226, 235, 39, 178, 117,
  9, 131, 44, 26, 27, 110, 90, 160, 82, 59, 214, 179, 41, 227, 47, 132,
  83, 209, 0, 237, 32, 252, 177, 91, 106, 203, 190, 57, 74, 76, 88, 207,
  208, 239, 170, 251, 67, 77, 51, 133, 69, 249, 2, 127, 80, 60, 159, 168,
  81, 163, 64, 143, 146, 157, 56, 245, 188, 182, 218, 33, 16, 255, 243, 210,
  205, 12, 19, 236, 95, 151, 68, 23, 196, 167, 126, 61, 100, 93, 25, 115,
  96, 129, 79, 220, 34, 42, 144, 136, 70, 238, 184, 20, 222, 94, 11, 219,
  224, 50, 58, 10, 73, 6, 36, 92, 194, 211, 172, 98, 145, 149, 228, 121,
  231, 200, 55, 109, 141, 213, 78, 169, 108, 86, 244, 234, 101, 122, 174, 8,
  186, 120, 37, 46, 28, 166, 180, 198, 232, 221, 116, 31, 75, 189, 139, 138,
  112, 62, 181, 102, 72, 3, 246, 14, 97, 53, 87, 185, 134, 193, 29, 158,
  225, 248, 152, 17, 105, 217, 142, 148, 155, 30, 135, 233, 206, 85, 40, 223,
  140, 161, 137, 13, 191, 230, 66, 104, 65, 153, 45, 15, 176, 84, 187, 22,
};
static __device__ const signed char TRELLIS_GAUSS8[256] = {
  -103, -27, 3, 34, -43, -12, 16, 59, -65, -16, 10, 43, -33, -6, 29, 70,
  -127, -28, 0, 33, -45, -13, 15, 51, -67, -17, 8, 41, -38, -6, 27, 77,
  -81, -24, 2, 32, -46, -9, 20, 55, -59, -18, 12, 48, -34, -3, 27, 111,
  -70, -25, 1, 31, -48, -10, 15, 52, -61, -21, 11, 46, -36, -4, 22, 97,
  -73, -26, 4, 31, -41, -8, 17, 62, -62, -19, 13, 45, -31, -1, 25, 127,
  -75, -22, 7, 36, -41, -12, 17, 60, -64, -20, 13, 44, -32, -5, 24, 86,
  -77, -23, 2, 34, -43, -8, 21, 65, -56, -16, 9, 50, -31, -2, 28, 81,
  -68, -22, 6, 39, -39, -7, 21, 57, -57, -17, 8, 49, -39, -7, 23, 68,
  -83, -29, 1, 32, -50, -14, 19, 54, -60, -21, 8, 47, -35, -3, 23, 73,
  -89, -25, 5, 37, -49, -11, 18, 64, -54, -19, 7, 39, -37, -4, 22, 71,
  -93, -27, 3, 30, -49, -11, 14, 61, -63, -20, 11, 40, -32, -2, 25, 89,
  -97, -23, 6, 35, -42, -12, 17, 67, -55, -15, 10, 43, -30, -5, 24, 83,
  -111, -28, 2, 33, -44, -13, 16, 57, -57, -17, 9, 42, -33, -2, 28, 79,
  -79, -24, 5, 38, -46, -9, 20, 56, -52, -14, 12, 49, -34, 0, 29, 75,
  -86, -29, 5, 37, -47, -10, 19, 53, -53, -18, 12, 46, -36, -1, 26, 103,
  -71, -26, 4, 36, -40, -8, 18, 63, -51, -15, 14, 41, -37, -5, 26, 93,
};
static __device__ const signed char TRELLIS_GAUSS7[128] = {
  -108, -30, 4, 39, -47, -14, 18, 64, -69, -16, 11, 44, -36, -5, 32, 78,
  -127, -32, 0, 36, -51, -15, 17, 56, -72, -18, 9, 43, -40, -6, 29, 82,
  -99, -27, 2, 35, -52, -11, 21, 60, -60, -20, 13, 51, -38, -2, 28, 108,
  -78, -28, 1, 34, -54, -12, 16, 58, -62, -23, 12, 49, -39, -3, 24, 99,
  -82, -29, 5, 33, -44, -9, 20, 69, -64, -21, 15, 47, -34, 0, 27, 127,
  -86, -25, 7, 40, -46, -13, 19, 66, -66, -22, 14, 46, -35, -4, 26, 92,
  -92, -26, 3, 38, -49, -10, 22, 72, -56, -17, 10, 54, -33, -1, 30, 86,
  -75, -24, 6, 42, -43, -8, 23, 62, -58, -19, 8, 52, -42, -7, 25, 75,
};

// The S-box codes' table index of an L-bit state (L 9..=16; cpu::trellis::mad8s_index): the
// S-box of its top 8 bits plus its low 8 bits, mod 256.
__device__ __forceinline__ u32 trellis_mad8s_index(u32 state, int L) {
  return ((u32)TRELLIS_SBOX[(state >> (L - 8)) & 0xFFu] + state) & 0xFFu;
}

// The integer code (its value times the divisor) of an L-bit state under 1mad8 (code 1),
// 1mad8h (code 2), 1mad8s (3), gauss8s (4) or gauss7s (5) (TrellisCode::int).
__device__ __forceinline__ int trellis_int8_code(u32 state, int L, int code) {
  if (code >= 3) {
    const u32 i = trellis_mad8s_index(state, L);
    if (code == 4) return TRELLIS_GAUSS8[i];
    if (code == 5) return TRELLIS_GAUSS7[i & 0x7Fu];
    return trellis_mad8_int(i);
  }
  return trellis_mad8_int(code == 2 ? trellis_mad8h_index(state, L) : state);
}

// What a code's integers are divided by (TrellisCode::divisor).
__device__ __forceinline__ float trellis_divisor(int code) {
  return code == 0 ? TRELLIS_MAD_SCALE
         : code == 4 ? TRELLIS_GAUSS8_SCALE
         : code == 5 ? TRELLIS_GAUSS7_SCALE
                     : TRELLIS_MAD8_SCALE;
}

// The code (0 1mad, 1 1mad8, 2 1mad8h, 3 1mad8s, 4 gauss8s, 5 gauss7s) and the state's bits
// of a kernel's `L` argument.
__device__ __forceinline__ int trellis_code_of(ll L) { return (int)(L >> TRELLIS_CODE_SHIFT); }
__device__ __forceinline__ ll trellis_l_of(ll L) { return L & ((1 << TRELLIS_CODE_SHIFT) - 1); }

// Whether the product of this shape reads tables in shared memory: 1mad8's 256 codes at its
// fast paths (L 8) and 1mad8h's (L 12); the S-box and the code table at the S-box codes' (L
// 12); blocks of 32 or 64.
__device__ __forceinline__ bool trellis_uses_lut(ll L, ll block) {
  const int code = trellis_code_of(L);
  const ll l = trellis_l_of(L);
  return ((code == 1 && l == 8) || (code >= 2 && code <= 5 && l == 12)) &&
         (block == 32 || block == 64);
}

// Floats of the product's tables (TrellisPlan::shared_bytes, graph_trellis.rs lut_floats):
// 1mad8's and 1mad8h's table (TRELLIS_LUT_FLOATS); the S-box codes' S-box (TRELLIS_LUT_FLOATS:
// 256 entries, 32 copies) then their code table (256 entries, 32 copies; gauss7s's 128).
__device__ __forceinline__ int trellis_lut_floats(ll L, ll block) {
  if (!trellis_uses_lut(L, block)) return 0;
  const int code = trellis_code_of(L);
  if (TRELLIS_STATES && code >= 3) return TRELLIS_STATE_WORDS;
  return code <= 2 ? TRELLIS_LUT_FLOATS : TRELLIS_LUT_FLOATS + (code == 5 ? 128 : 256) * 32;
}

// The dynamic shared memory of the product kernels: the table first, where the product reads
// it (TRELLIS_LUT_FLOATS floats), then the padded input (K + pad K / 32 floats; trellis_xs)
// (TrellisPlan::shared_bytes). The table at the start has an address known when the kernel is
// linked (after the static arrays), so each lookup is one LDS at [index + constant]: after the
// padded input its address was a register in the kernels with static shared arrays
// (trellis_linear, trellis_qkv, trellis_gate_up, trellis_matvec_out), and every lookup took an
// add more.
__device__ __forceinline__ float* trellis_lut() {
  extern __shared__ __align__(16) unsigned char smem[];
  return (float*)smem;
}
__device__ __forceinline__ float* trellis_xs_base(ll L, ll block) {
  return trellis_lut() + trellis_lut_floats(L, block);
}

// The table of 1mad8's 256 codes (1mad8h's too: its index is an 8-bit state of 1mad8) at
// trellis_lut(), for the shape, where the product reads it:
// warp w computes states 32 w + lane, then writes each of its 32 states' 32 copies (one
// shuffle and one conflict-free store a state). Written before the PDL wait (it depends on no
// kernel); the barriers of the prologue order it before the product.
//
// The S-box codes' tables (code 3, 4, 5 at L 12): the S-box first, entry t copy j at word
// t * 32 + j holding SBOX[t] << 7 (where the product adds it to the state's bottom byte at bit
// 7), then the code table at TRELLIS_LUT_FLOATS, entry i copy j at i * 32 + j holding the
// float of the code's integer at index i (256 entries; gauss7s's 128). Each thread writes
// words i, i + threads, ...: every lane of a warp reads the same table entry (one broadcast)
// and writes its own bank.
__device__ __forceinline__ void trellis_lut_fill(ll L, ll block) {
  if (!trellis_uses_lut(L, block)) return;
  const int code = trellis_code_of(L);
#if TRELLIS_STATES
  if (code >= 3) {
    // The table of every 12-bit state's code (TRELLIS_STATES): first each word's four biased
    // codes at its copy 0, then, after a barrier (every thread of the block calls this), each
    // word's copies 0..31 from copy 0, four a 16-byte store (copy 0 rewritten with its value).
    u32* t = (u32*)trellis_lut();
    for (int q = threadIdx.x; q < 1024; q += blockDim.x) {
      u32 w = 0;
      for (int k = 0; k < 4; ++k)
        w |= (u32)((trellis_int8_code((u32)(4 * q + k), 12, code) + 128) & 0xFF) << (8 * k);
      t[q * 32] = w;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 1024 * 8; i += blockDim.x) {
      uint4 v;
      v.x = v.y = v.z = v.w = t[(i >> 3) * 32];
      *(uint4*)(t + (i >> 3) * 32 + (i & 7) * 4) = v;
    }
    return;
  }
#endif
  if (code >= 3) {
    u32* sb = (u32*)trellis_lut();
    float* ct = trellis_lut() + TRELLIS_LUT_FLOATS;
    const int n = code == 5 ? 128 : 256;
    for (int i = threadIdx.x; i < 256 * 32; i += blockDim.x) sb[i] = (u32)TRELLIS_SBOX[i >> 5] << 7;
    for (int i = threadIdx.x; i < n * 32; i += blockDim.x) {
      const int e = i >> 5;
      ct[i] = (float)(code == 4 ? (int)TRELLIS_GAUSS8[e]
                      : code == 5 ? (int)TRELLIS_GAUSS7[e]
                                  : trellis_mad8_int((u32)e));
    }
    return;
  }
  float* lut = trellis_lut();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int s0 = warp * 32; s0 < 256; s0 += warps * 32) {
    const float v = (float)trellis_mad8_int((u32)(s0 + lane));
    for (int i = 0; i < 32; ++i) lut[(s0 + i) * 32 + lane] = __shfl_sync(0xffffffffu, v, i);
  }
}

// Bit offset (in a block's stream of bits = block * kb bits) of the first bit of weight t's
// L-bit window (TrellisSpec::window_start).
__device__ __forceinline__ int trellis_window_start(int t, int kb, int L, int bits) {
  return ((t + 1) * kb + bits - L) % bits;
}

// Weight t's state from a block's words (bw of them), read independently of its neighbours.
__device__ __forceinline__ u32 trellis_window(const u32* words, int bw, int t, int kb, int L,
                                              int bits) {
  const int start = trellis_window_start(t, kb, L, bits);
  const int a = start >> 5, off = start & 31;
  const u32 hi = words[a], lo = words[a + 1 == bw ? 0 : a + 1];
  const u64 v = (((u64)hi << 32) | lo) >> (64 - off - L);
  return (u32)v & ((1u << L) - 1u);
}

// Block b of row r of the decoded matrix (trellis_decode).
__device__ __forceinline__ void trellis_decode_block(const u32* W, const float* scales,
                                                     float* out, ll r, ll b, ll K, ll kb, ll L,
                                                     ll block, ll bw, ll bits, int code) {
  const u32* words = W + r * (K * kb / 32) + b * bw;
  float* o = out + r * K + b * block;
  const float scale = scales[r];
  const u32 mask = (1u << L) - 1u, kmask = (1u << kb) - 1u;
  u32 state = trellis_window(words, (int)bw, 0, (int)kb, (int)L, (int)bits);
  auto value = [&](u32 s) {
    if (code) return (float)trellis_int8_code(s, (int)L, code) / trellis_divisor(code) * scale;
    const u32 x = s * TRELLIS_MAD_A + TRELLIS_MAD_B;
    const u32 y = (x & 0x00FF00FFu) + ((x >> 8) & 0x00FF00FFu);
    const u32 sum = (y & 0xFFFFu) + (y >> 16);
    return (float)((int)sum - 510) / TRELLIS_MAD_SCALE * scale;
  };
  o[0] = value(state);
  ll pos = kb;
  for (ll t = 1; t < block; ++t, pos += kb) {
    const ll a = pos >> 5, off = pos & 31;
    u32 v;
    if (off + kb <= 32) {
      v = (words[a] >> (32 - off - kb)) & kmask;
    } else {
      const u64 both = ((u64)words[a] << 32) | words[(a + 1) % bw];
      v = (u32)(both >> (64 - off - kb)) & kmask;
    }
    state = ((state << kb) | v) & mask;
    o[t] = value(state);
  }
}

// The decoded matrix: out[r, c] = scale[r] * code(state_rc), code = (byte sum - 510) / 147.8...
// (1mad; the int8 codes: their integer / the code's divisor) as decode_row computes it (sequential
// states: the first from its window, then k new bits a weight). One thread a block of a row,
// the grid striding over them.
extern "C" __global__ void trellis_decode(const u32* W, const float* scales, float* out, ll N,
                                          ll K, ll kb, ll L, ll block) {
  const int code = trellis_code_of(L);
  L = trellis_l_of(L);
  const ll nb = K / block, bw = block * kb / 32, bits = block * kb;
  for (ll i = (ll)blockIdx.x * blockDim.x + threadIdx.x; i < N * nb;
       i += (ll)gridDim.x * blockDim.x)
    trellis_decode_block(W, scales, out, i / nb, i % nb, K, kb, L, block, bw, bits, code);
}

// The orthonormal Walsh-Hadamard transform in shared memory, in place, of each consecutive
// block of hb (a power of two) of n elements, element i at buf[i + pad (i / 32)] (the padded
// input of the product, pad 1 or 2; 0 for the output's buffer), the block's threads together.
// The butterflies are fwht_blocks_portable's, each element's adds in the same order (span 1,
// 2, 4, ...: the lower element of a pair gets a + b, the upper a - b), so the same bits; only
// their schedule differs: a warp holds R runs of 32 consecutive elements in registers and does
// spans 1..16 with shuffles and spans 32..16 R in registers (trellis_fwht_warp), then the
// wider spans 3 at a time, 8 elements a thread strided in registers (trellis_fwht_strided):
// one pass for hb up to 256, two up to 2048, three for 4096, instead of a barrier a span, and
// shift-and-mask indices (the butterfly loop with runtime 64-bit divisions took ~112
// instructions a pair). The last pass multiplies by hscale (1 / sqrt(hb), the host's float32
// value) as fwht_blocks does after its last span.
__device__ __forceinline__ int trellis_pidx(int i, int pad) { return i + pad * (i >> 5); }

template <int R>
__device__ __forceinline__ void trellis_fwht_warp(float* buf, int n, int lhb, int pad, bool last,
                                                  float hscale) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int shuf = lhb < 5 ? lhb : 5;
  for (int c = warp; c * 32 * R < n; c += warps) {  // warp-uniform: every lane shuffles
    // Element c 32 R + lane + 32 r sits at p[r (32 + pad)] (trellis_pidx).
    float* p = buf + c * (32 + pad) * R + lane;
    const int left = n - c * 32 * R - lane;  // elements r with 32 r < left exist
    float v[R];
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = 32 * r < left ? p[r * (32 + pad)] : 0.f;
    for (int t = 0; t < shuf; ++t) {
      const int h = 1 << t;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float o = __shfl_xor_sync(0xffffffffu, v[r], h);
        v[r] = (lane & h) ? o - v[r] : v[r] + o;  // upper: a - b (a the partner's); lower: a + b
      }
    }
#pragma unroll
    for (int h = 1; h < R; h <<= 1) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (!(r & h)) {
          const float a = v[r], b = v[r + h];
          v[r] = a + b;
          v[r + h] = a - b;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (32 * r < left) p[r * (32 + pad)] = last ? v[r] * hscale : v[r];
  }
}

// Spans 2^s .. 2^(s + M - 1) (s >= 5): thread groups of 2^M elements 2^s apart, in registers.
template <int M>
__device__ __forceinline__ void trellis_fwht_strided(float* buf, int n, int s, int pad, bool last,
                                                     float hscale) {
  constexpr int E = 1 << M;
  const int low = (1 << s) - 1;
  // Element base + (j << s) sits at q[j step] (trellis_pidx: s >= 5 keeps the padding's runs).
  const int step = (1 << s) + pad * (1 << (s - 5));
  for (int g = threadIdx.x; g < (n >> M); g += blockDim.x) {
    const int base = ((g >> s) << (s + M)) | (g & low);
    float* q = buf + trellis_pidx(base, pad);
    float v[E];
#pragma unroll
    for (int j = 0; j < E; ++j) v[j] = q[j * step];
#pragma unroll
    for (int h = 1; h < E; h <<= 1) {
#pragma unroll
      for (int j = 0; j < E; ++j) {
        if (!(j & h)) {
          const float a = v[j], b = v[j + h];
          v[j] = a + b;
          v[j + h] = a - b;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < E; ++j) q[j * step] = last ? v[j] * hscale : v[j];
  }
}

// The transform above (barriers before, between and after its passes).
__device__ __forceinline__ void trellis_fwht_pad(float* buf, int n, int hb, int pad,
                                                 float hscale) {
  int lhb = 0;
  while ((1 << lhb) < hb) ++lhb;
  // R = hb / 32 runs a warp, at most 8 (the spans up to 128 in the first pass; 16 would take
  // more registers than the product kernels' 64).
  const int lr = lhb <= 5 ? 0 : lhb - 5 < 3 ? lhb - 5 : 3;
  int s = lhb <= 5 ? lhb : 5 + lr;
  __syncthreads();
  switch (lr) {
    case 0: trellis_fwht_warp<1>(buf, n, lhb, pad, s >= lhb, hscale); break;
    case 1: trellis_fwht_warp<2>(buf, n, lhb, pad, s >= lhb, hscale); break;
    case 2: trellis_fwht_warp<4>(buf, n, lhb, pad, s >= lhb, hscale); break;
    default: trellis_fwht_warp<8>(buf, n, lhb, pad, s >= lhb, hscale); break;
  }
  while (s < lhb) {
    const int m = lhb - s < 3 ? lhb - s : 3;
    const bool last = s + m >= lhb;
    __syncthreads();
    switch (m) {
      case 1: trellis_fwht_strided<1>(buf, n, s, pad, last, hscale); break;
      case 2: trellis_fwht_strided<2>(buf, n, s, pad, last, hscale); break;
      default: trellis_fwht_strided<3>(buf, n, s, pad, last, hscale); break;
    }
    s += m;
  }
  __syncthreads();
}

// In-place orthonormal Walsh-Hadamard transform of buf[0, hb) (shared, unpadded), the block's
// threads together (trellis_fwht_pad), then times hscale.
__device__ __forceinline__ void trellis_fwht(float* buf, int hb, float hscale) {
  trellis_fwht_pad(buf, hb, hb, 0, hscale);
}

// 1 / rms of the K bfloat16 inputs, the block's threads together (each thread's strided sum
// of squares, warp trees, the warps' sums in order): trellis_input and trellis_matvec_in
// reduce in this one order, so they norm to the same bits.
__device__ __forceinline__ float trellis_inv_rms(const bf16_t* xin, ll K, double eps, float* red) {
  // TRELLIS_THREADS' partition whatever the block's threads (a wider fused kernel's others add
  // nothing): the same sums in the same order as trellis_input's.
  float ss = 0.f;
  if (threadIdx.x < TRELLIS_THREADS) {
    for (ll i = threadIdx.x; i < K; i += TRELLIS_THREADS) {
      const float v = bf2f(xin[i]);
      ss += v * v;
    }
  }
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0 && threadIdx.x < TRELLIS_THREADS) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  float tot = 0.f;
  for (int i = 0; i < TRELLIS_THREADS / 32; ++i) tot += red[i];
  return rsqrtf(tot / (float)K + (float)eps);
}

// xh = H_c (sv * x) for Hadamard block blockIdx.x (of hb inputs), sequence blockIdx.y: x =
// xin (bfloat16), or with norm rms_norm(xin, normw, eps) rounded as MLX's fast.rms_norm rounds
// it (norm2 in graph_decode.cu; every block sums the squares of the whole input, from L2).
// xh is float32, as TrellisLinear's product runs in float32.
extern "C" __global__ void __launch_bounds__(TRELLIS_THREADS) trellis_input(
    const bf16_t* xin, const bf16_t* normw, const float* sv, float* xh, ll K, ll hb,
    double hscale, ll norm, double eps) {
  __shared__ float buf[TRELLIS_MAX_HB];
  __shared__ float red[TRELLIS_THREADS / 32];
  pdl_wait_then_release();
  xin += (ll)blockIdx.y * K;
  xh += (ll)blockIdx.y * K;
  const ll c0 = (ll)blockIdx.x * hb;
  const float inv = norm ? trellis_inv_rms(xin, K, eps, red) : 1.f;
  for (int i = threadIdx.x; i < hb; i += blockDim.x) {
    float v = bf2f(xin[c0 + i]);
    if (norm) v = rbf(bf2f(normw[c0 + i]) * rbf(v * inv));
    buf[i] = v * sv[c0 + i];
  }
  trellis_fwht(buf, (int)hb, (float)hscale);
  for (int i = threadIdx.x; i < hb; i += blockDim.x) xh[c0 + i] = buf[i];
}

// The input's element c sits at xs[c + pad (c / 32)] in shared memory, pad 2 for blocks of 32
// and 1 otherwise (trellis_pad): the lanes of a warp reading elements t and t + 1 of 32
// consecutive blocks (the fast path's 8-byte loads: a block then starts at an even float) hit
// distinct banks in each half-warp's phase, blocks of 32 at 34 floats apart, of 64 at 66.
__device__ __forceinline__ int trellis_pad(ll block) { return block == 32 ? 2 : 1; }
__device__ __forceinline__ int trellis_xs(ll c, int pad) { return (int)(c + pad * (c >> 5)); }

// One block of BLOCK weights at KB bits with an L-bit state (the fast cases: blocks of 32 with
// L 8, blocks of 64 with L 12): its words in registers, each weight's window one funnel shift
// (or one shift where it sits in one word) at a position known at compile time, its code in
// registers (trellis_code), two FMA chains. No state is carried from weight to weight, so
// nothing serializes the 32 or 64 codes but the two accumulators. LUT 1 (1mad8 at L 8): each
// code is one load from the table (lut, the same for every lane) at byte state * 128 + lane * 4
// (the lane's copy, lane4 = lane * 4): the window's shift puts the state at bit 7 and one LOP3
// masks it and ors the lane in, instead of 1MAD's three instructions after the shift and mask.
// LUT 2 (1mad8h, L 9..=15): the same load at the state's hashed index (trellis_mad8h_index):
// the window's shift puts the state at bit 0 (earlier bits of the stream above it, nothing
// below), and one multiply by 128 + 2^(15 - L) adds the state at bit 7 (its bottom byte at bits
// 7..14, zeros below) to the state at bit 15 - L (its top byte at bits 7..14): bits 7..14 of the
// product are the index (no carry reaches bit 7: the first term is zero below it; what lies
// above the state lands above bit 14), and the LOP3 masks them and ors the lane in. One IMAD a
// weight more than 1mad8.
// LUT 3 (the S-box codes with 256 entries: 1mad8s, gauss8s) and 4 (gauss7s's 128), L 9..=15:
// the window's shift puts the state at bit 15 - L (its top byte at bits 7..14; earlier stream
// bits above it, later ones below), one LOP3 masks the top byte and ors the lane in, one load
// reads SBOX[top] << 7 from the S-box's copy (lut, word top * 32 + lane); one multiply-add
// by 2^(L - 8) moves the state's bottom byte to bits 7..14 and adds it: bits 7..14 are the
// index (S-box plus bottom byte, mod 256; the stream bits below land below bit 7, where the
// S-box's word is zero, so no carry reaches bit 7; those above land above bit 14), and one
// LOP3 masks its 8 bits (7 for gauss7s) and ors the lane in for the code's load (the code
// table at lut + TRELLIS_LUT_FLOATS). Two table loads a weight (1mad8h: one), each
// conflict-free; one LOP3 more than 1mad8h.
template <int KB, int L, int BLOCK, int LUT = 0>
__device__ __forceinline__ float trellis_block(const u32* w, const float* xs,
                                               const float* lut = nullptr, u32 lane4 = 0) {
  static_assert(LUT != 1 || L == 8, "1mad8's table path is L 8");
  static_assert(LUT != 2 || (L >= 9 && L <= 15), "1mad8h's table path is L 9..=15");
  static_assert(LUT < 3 || LUT == 5 || (L >= 9 && L <= 15),
                "the S-box codes' table path is L 9..=15");
  static_assert(LUT != 5 || L == 12, "the states' table path is L 12");
  constexpr int BITS = BLOCK * KB, BW = BITS / 32, PAD = BLOCK == 32 ? 2 : 1;
  constexpr u32 MASK = (1u << L) - 1u;
  float acc0 = 0.f, acc1 = 0.f;
#pragma unroll
  for (int t = 0; t < BLOCK; ++t) {
    const int start = ((t + 1) * KB + BITS - L) % BITS;
    const int a = start >> 5, off = start & 31;
    float c;
    if (LUT == 5) {
      // The state at bits 5..16 (TRELLIS_STATES): its word s >> 2 at bits 7..16, its byte
      // s & 3 at bits 5..6; stream bits above and below.
      u32 sb;
      if (off + L <= 32) {
        const int sh = 32 - off - L - 5;
        sb = sh >= 0 ? w[a] >> sh : w[a] << -sh;
      } else {
        sb = __funnelshift_r(w[a + 1 == BW ? 0 : a + 1], w[a], 64 - off - L - 5);
      }
      const u32 q = *(const u32*)((const char*)lut + ((sb & 0x1FF80u) | lane4));
      const u32 v = __byte_perm(q, 0x4B000000u, ((sb >> 5) & 3u) | 0x7650u);
      c = __uint_as_float(v) - 8388736.f;  // 2^23 + 128: the byte's bias
    } else if (LUT >= 3) {
      // The state at bits 15 - L .. 14 (its top byte at 7..14): sh = the window's shift less
      // 15 - L (stream bits above and below it).
      u32 sb;
      if (off + L <= 32) {
        const int sh = 32 - off - L - (15 - L);
        sb = sh >= 0 ? w[a] >> sh : w[a] << -sh;
      } else {
        sb = __funnelshift_r(w[a + 1 == BW ? 0 : a + 1], w[a], 64 - off - L - (15 - L));
      }
      const u32 s7 = *(const u32*)((const char*)lut + ((sb & 0x7F80u) | lane4));
      const u32 h = sb * (1u << (L - 8)) + s7;
      constexpr u32 IMASK = LUT == 4 ? 0x3F80u : 0x7F80u;
      c = *(const float*)((const char*)lut + 4 * TRELLIS_LUT_FLOATS + ((h & IMASK) | lane4));
    } else if (LUT == 2) {
      u32 st;
      if (off + L <= 32) {
        st = w[a] >> (32 - off - L);
      } else {
        st = __funnelshift_r(w[a + 1 == BW ? 0 : a + 1], w[a], 64 - off - L);
      }
      const u32 h = st * (128u + (1u << (15 - L)));
      c = *(const float*)((const char*)lut + ((h & 0x7F80u) | lane4));
    } else if (LUT == 1) {
      // The state at bits 7..14 (L 8): sh = the window's shift less 7.
      constexpr u32 SMASK = MASK << 7;
      u32 sb;
      if (off + L <= 32) {
        const int sh = 32 - off - L - 7;
        sb = sh >= 0 ? w[a] >> sh : w[a] << -sh;
      } else {
        sb = __funnelshift_r(w[a + 1 == BW ? 0 : a + 1], w[a], 64 - off - L - 7);
      }
      c = *(const float*)((const char*)lut + ((sb & SMASK) | lane4));
    } else {
      u32 state;
      if (off + L <= 32) {
        state = (w[a] >> (32 - off - L)) & MASK;
      } else {
        state = __funnelshift_r(w[a + 1 == BW ? 0 : a + 1], w[a], 64 - off - L) & MASK;
      }
      c = trellis_code(state);
    }
    if (t & 1) {
      acc1 = fmaf(c, xs[t + PAD * (t >> 5)], acc1);
    } else {
      acc0 = fmaf(c, xs[t + PAD * (t >> 5)], acc0);
    }
  }
  return acc0 + acc1;
}

// A block's BW words in 16-byte loads where BW is a multiple of 4 (4 bits), else 8-byte ones
// where even, else one at a time (3 bits, blocks of 32: the three loads of a warp cover one
// contiguous span, the second and third from L1). Rows are aligned to match (K a multiple of
// the block). 16-byte loads bypass L1: weights are read once a step.
template <int BW>
__device__ __forceinline__ void trellis_load(const u32* p, u32* w) {
  if (BW % 4 == 0) {
#pragma unroll
    for (int i = 0; i < BW / 4; ++i) {
      const uint4 v = ld_stream((const uint4*)p + i);
      w[4 * i] = v.x;
      w[4 * i + 1] = v.y;
      w[4 * i + 2] = v.z;
      w[4 * i + 3] = v.w;
    }
  } else if (BW % 2 == 0) {
#pragma unroll
    for (int i = 0; i < BW / 2; ++i) {
      const uint2 v = ((const uint2*)p)[i];
      w[2 * i] = v.x;
      w[2 * i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < BW; ++i) w[i] = p[i];
  }
}

// The fast path's rows: lane j of a group of lpr lanes (32 / lpr rows a warp, the warps of a
// block on consecutive rows) takes blocks j, j + lpr, ... of its row; the group's sums meet in
// a shuffle tree. The host picks lpr (graph_trellis.rs, lanes_per_row) so that the blocks fill
// the lanes and the grid fills the GPU; the lanes of a warp read neighbouring blocks of
// neighbouring rows, one contiguous span of words.
template <int KB, int L, int BLOCK, int LUT = 0>
__device__ __forceinline__ float trellis_row(const u32* row, const float* xs, int j, int lpr,
                                             ll nb, const float* lut = nullptr, u32 lane4 = 0) {
  constexpr int BW = BLOCK * KB / 32;
  float acc = 0.f;
#if TRELLIS_PAIR
  // Two blocks a pass, both loads issued before either block's codes (TRELLIS_PAIR): a lane
  // of a 4,096-wide row at 32 lanes a row has two blocks, which then wait on one load latency
  // instead of two in a row. The blocks are summed in the same order: the same bits.
  constexpr int PAD = BLOCK == 32 ? 2 : 1;
  ll b = j;
  for (; b + lpr < nb; b += 2 * lpr) {
#if defined(__CUDA_ARCH__) && TRELLIS_PIPE
    // The next pair asked of L2 (TRELLIS_PIPE's hint).
    for (ll n = b + 2 * lpr; n < nb && n < b + 4 * lpr; n += lpr)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(row + n * BW));
#endif
    u32 w0[BW], w1[BW];
    trellis_load<BW>(row + b * BW, w0);
    trellis_load<BW>(row + (b + lpr) * BW, w1);
    acc += trellis_block<KB, L, BLOCK, LUT>(w0, xs + trellis_xs(b * BLOCK, PAD), lut, lane4);
    acc += trellis_block<KB, L, BLOCK, LUT>(w1, xs + trellis_xs((b + lpr) * BLOCK, PAD), lut,
                                            lane4);
  }
  if (b < nb) {
    u32 w[BW];
    trellis_load<BW>(row + b * BW, w);
    acc += trellis_block<KB, L, BLOCK, LUT>(w, xs + trellis_xs(b * BLOCK, PAD), lut, lane4);
  }
#else
  for (ll b = j; b < nb; b += lpr) {
#if defined(__CUDA_ARCH__) && TRELLIS_PIPE
    // The lane's next block asked of L2 before this one's load (TRELLIS_PIPE: a hint, no
    // register held for it; nothing on the CPU emulator).
    if (b + lpr < nb) asm volatile("prefetch.global.L2 [%0];" ::"l"(row + (b + lpr) * BW));
#endif
    u32 w[BW];
    trellis_load<BW>(row + b * BW, w);
    acc += trellis_block<KB, L, BLOCK, LUT>(w, xs + trellis_xs(b * BLOCK, BLOCK == 32 ? 2 : 1),
                                            lut, lane4);
  }
#endif
  return acc;
}

// 1mad8's table path over two rows at once (rows a and b, the same blocks j, j + lpr, ...):
// each input pair is loaded from shared memory once for both rows' products (the table's
// loads and the input's are what bind this loop: a wavefront a weight each, the input's now
// half). Each row's sums are trellis_row<.., 1>'s, in the same order: the same bits.
template <int KB, int L, int BLOCK>
__device__ __forceinline__ void trellis_row2(const u32* ra, const u32* rb, const float* xs, int j,
                                             int lpr, ll nb, const float* lut, u32 lane4,
                                             float& acc_a, float& acc_b) {
  constexpr int BITS = BLOCK * KB, BW = BITS / 32, PAD = BLOCK == 32 ? 2 : 1;
  constexpr u32 SMASK = ((1u << L) - 1u) << 7;
  for (ll b = j; b < nb; b += lpr) {
    u32 wa[BW], wb[BW];
    trellis_load<BW>(ra + b * BW, wa);
    trellis_load<BW>(rb + b * BW, wb);
    const float* x = xs + trellis_xs(b * BLOCK, PAD);
    float a0 = 0.f, a1 = 0.f, b0 = 0.f, b1 = 0.f;
#pragma unroll
    for (int t = 0; t < BLOCK; ++t) {
      const int start = ((t + 1) * KB + BITS - L) % BITS;
      const int a = start >> 5, off = start & 31;
      u32 sa, sb;
      if (off + L <= 32) {
        const int sh = 32 - off - L - 7;
        sa = sh >= 0 ? wa[a] >> sh : wa[a] << -sh;
        sb = sh >= 0 ? wb[a] >> sh : wb[a] << -sh;
      } else {
        const int n = a + 1 == BW ? 0 : a + 1;
        sa = __funnelshift_r(wa[n], wa[a], 64 - off - L - 7);
        sb = __funnelshift_r(wb[n], wb[a], 64 - off - L - 7);
      }
      const float ca = *(const float*)((const char*)lut + ((sa & SMASK) | lane4));
      const float cb = *(const float*)((const char*)lut + ((sb & SMASK) | lane4));
      const float xv = x[t + PAD * (t >> 5)];
      if (t & 1) {
        a1 = fmaf(ca, xv, a1);
        b1 = fmaf(cb, xv, b1);
      } else {
        a0 = fmaf(ca, xv, a0);
        b0 = fmaf(cb, xv, b0);
      }
    }
    acc_a += a0 + a1;
    acc_b += b0 + b1;
  }
}

// Any shape (k 2..4, L up to 16, any block): lane j of the group takes weights j, j + lpr, ...
// of its row, each window read from its block's words (through L1); code: 0 1mad, 1 1mad8's
// codes, 2 1mad8h's, 3 1mad8s's, 4 gauss8s's, 5 gauss7s's (computed: trellis_int8_code).
__device__ __forceinline__ float trellis_row_any(const u32* row, const float* xs, int j, int lpr,
                                                 ll K, ll kb, ll L, ll block, int code) {
  const ll bw = block * kb / 32, bits = block * kb;
  const u32 mask = (1u << L) - 1u;
  const int pad = trellis_pad(block);
  float acc = 0.f;
  for (ll c = j; c < K; c += lpr) {
    const ll b = c / block, t = c % block;
    const u32 s = trellis_window(row + b * bw, (int)bw, (int)t, (int)kb, (int)L, (int)bits) & mask;
    const float v = code ? (float)trellis_int8_code(s, (int)L, code) : trellis_code(s);
    acc = fmaf(v, xs[trellis_xs(c, pad)], acc);
  }
  return acc;
}

// The rows of trellis_matvec and trellis_matvec_in, the input in shared memory (xs; the table
// of 1mad8's codes, where the shape reads it, at trellis_lut()). L: the kernels' argument (the
// code above the state's bits). bid of nbk: the block's place among the blocks over these rows
// (blockIdx.x of gridDim.x, or trellis_qkv's slice of a flat grid).
__device__ __forceinline__ void trellis_rows(const u32* W, const float* scales, const float* xs,
                                             float* z, ll N, ll K, ll kb, ll L, ll block,
                                             ll lpr, ll bid, ll nbk) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int g = (int)lpr, j = lane % g, rpw = 32 / g;
  const ll wpr = K * kb / 32, nb = K / block;
  const int code = trellis_code_of(L);
  const bool lut = trellis_uses_lut(L, block);
  const float* tab = trellis_lut();
  const u32 lane4 = 4u * lane;
  L = trellis_l_of(L);
  // The fast cases: blocks of 32 with L 8 (the quantizer's 3-bit choice), blocks of 64 with
  // L 12 (the config's defaults); 1mad8's blocks of 32 and 64 with L 8 (its table); 1mad8h's
  // blocks of 32 and 64 with L 12 (the same table, at hashed indices).
  const bool f32 = block == 32 && L == 8, f64 = block == 64 && L == 12;
  const float div = trellis_divisor(code);
#if TRELLIS_ROWS2
  if (lut && code == 1) {
    // Two of the warp's row groups at once (trellis_row2): this one and the one a grid stride
    // on (the block's next chunk of rows, so each block writes the rows it wrote before: the
    // epilogue's counting is unchanged); a missing second row repeats the first, discarded.
    const ll stride = nbk * warps * rpw;
    for (ll r0 = (bid * warps + warp) * rpw; r0 < N; r0 += 2 * stride) {
      const ll ra = r0 + lane / g, rb = ra + stride;
      float acc_a = 0.f, acc_b = 0.f;
      if (ra < N) {
        const u32* rowa = W + ra * wpr;
        const u32* rowb = rb < N ? W + rb * wpr : rowa;
        if (block == 32 && kb == 2) {
          trellis_row2<2, 8, 32>(rowa, rowb, xs, j, g, nb, tab, lane4, acc_a, acc_b);
        } else if (block == 32 && kb == 3) {
          trellis_row2<3, 8, 32>(rowa, rowb, xs, j, g, nb, tab, lane4, acc_a, acc_b);
        } else if (block == 32) {
          trellis_row2<4, 8, 32>(rowa, rowb, xs, j, g, nb, tab, lane4, acc_a, acc_b);
        } else if (kb == 2) {
          trellis_row2<2, 8, 64>(rowa, rowb, xs, j, g, nb, tab, lane4, acc_a, acc_b);
        } else if (kb == 3) {
          trellis_row2<3, 8, 64>(rowa, rowb, xs, j, g, nb, tab, lane4, acc_a, acc_b);
        } else {
          trellis_row2<4, 8, 64>(rowa, rowb, xs, j, g, nb, tab, lane4, acc_a, acc_b);
        }
      }
      for (int o = g / 2; o > 0; o >>= 1) {
        acc_a += __shfl_xor_sync(0xffffffffu, acc_a, o);
        acc_b += __shfl_xor_sync(0xffffffffu, acc_b, o);
      }
      if (ra < N && j == 0) z[ra] = acc_a * (scales[ra] / div);
      if (rb < N && j == 0) z[rb] = acc_b * (scales[rb] / div);
    }
    return;
  }
#endif
  for (ll r0 = (bid * warps + warp) * rpw; r0 < N; r0 += nbk * warps * rpw) {
    const ll r = r0 + lane / g;
    float acc = 0.f;
    if (r < N) {
      const u32* row = W + r * wpr;
#if TRELLIS_STATES
      if (lut && code >= 3) {
        // The S-box codes at L 12 from the states' table (TRELLIS_STATES).
        if (block == 32 && kb == 2) {
          acc = trellis_row<2, 12, 32, 5>(row, xs, j, g, nb, tab, lane4);
        } else if (block == 32 && kb == 3) {
          acc = trellis_row<3, 12, 32, 5>(row, xs, j, g, nb, tab, lane4);
        } else if (block == 32) {
          acc = trellis_row<4, 12, 32, 5>(row, xs, j, g, nb, tab, lane4);
        } else if (kb == 2) {
          acc = trellis_row<2, 12, 64, 5>(row, xs, j, g, nb, tab, lane4);
        } else if (kb == 3) {
          acc = trellis_row<3, 12, 64, 5>(row, xs, j, g, nb, tab, lane4);
        } else {
          acc = trellis_row<4, 12, 64, 5>(row, xs, j, g, nb, tab, lane4);
        }
      } else
#endif
      if (lut && code >= 3 && code <= 4) {
        // 1mad8s and gauss8s at L 12 (trellis_uses_lut): the S-box and a 256-entry table.
        if (block == 32 && kb == 2) {
          acc = trellis_row<2, 12, 32, 3>(row, xs, j, g, nb, tab, lane4);
        } else if (block == 32 && kb == 3) {
          acc = trellis_row<3, 12, 32, 3>(row, xs, j, g, nb, tab, lane4);
        } else if (block == 32) {
          acc = trellis_row<4, 12, 32, 3>(row, xs, j, g, nb, tab, lane4);
        } else if (kb == 2) {
          acc = trellis_row<2, 12, 64, 3>(row, xs, j, g, nb, tab, lane4);
        } else if (kb == 3) {
          acc = trellis_row<3, 12, 64, 3>(row, xs, j, g, nb, tab, lane4);
        } else {
          acc = trellis_row<4, 12, 64, 3>(row, xs, j, g, nb, tab, lane4);
        }
      } else if (lut && code == 5) {
        // gauss7s at L 12: the S-box and its 128-entry table.
        if (block == 32 && kb == 2) {
          acc = trellis_row<2, 12, 32, 4>(row, xs, j, g, nb, tab, lane4);
        } else if (block == 32 && kb == 3) {
          acc = trellis_row<3, 12, 32, 4>(row, xs, j, g, nb, tab, lane4);
        } else if (block == 32) {
          acc = trellis_row<4, 12, 32, 4>(row, xs, j, g, nb, tab, lane4);
        } else if (kb == 2) {
          acc = trellis_row<2, 12, 64, 4>(row, xs, j, g, nb, tab, lane4);
        } else if (kb == 3) {
          acc = trellis_row<3, 12, 64, 4>(row, xs, j, g, nb, tab, lane4);
        } else {
          acc = trellis_row<4, 12, 64, 4>(row, xs, j, g, nb, tab, lane4);
        }
      } else if (lut && code == 2) {
        // 1mad8h at L 12 (trellis_uses_lut).
        if (block == 32 && kb == 2) {
          acc = trellis_row<2, 12, 32, 2>(row, xs, j, g, nb, tab, lane4);
        } else if (block == 32 && kb == 3) {
          acc = trellis_row<3, 12, 32, 2>(row, xs, j, g, nb, tab, lane4);
        } else if (block == 32) {
          acc = trellis_row<4, 12, 32, 2>(row, xs, j, g, nb, tab, lane4);
        } else if (kb == 2) {
          acc = trellis_row<2, 12, 64, 2>(row, xs, j, g, nb, tab, lane4);
        } else if (kb == 3) {
          acc = trellis_row<3, 12, 64, 2>(row, xs, j, g, nb, tab, lane4);
        } else {
          acc = trellis_row<4, 12, 64, 2>(row, xs, j, g, nb, tab, lane4);
        }
      } else if (lut && block == 32 && kb == 2) {
        acc = trellis_row<2, 8, 32, 1>(row, xs, j, g, nb, tab, lane4);
      } else if (lut && block == 32 && kb == 3) {
        acc = trellis_row<3, 8, 32, 1>(row, xs, j, g, nb, tab, lane4);
      } else if (lut && block == 32 && kb == 4) {
        acc = trellis_row<4, 8, 32, 1>(row, xs, j, g, nb, tab, lane4);
      } else if (lut && kb == 2) {
        acc = trellis_row<2, 8, 64, 1>(row, xs, j, g, nb, tab, lane4);
      } else if (lut && kb == 3) {
        acc = trellis_row<3, 8, 64, 1>(row, xs, j, g, nb, tab, lane4);
      } else if (lut && kb == 4) {
        acc = trellis_row<4, 8, 64, 1>(row, xs, j, g, nb, tab, lane4);
      } else if (code) {
        acc = trellis_row_any(row, xs, j, g, K, kb, L, block, code);
      } else if (f32 && kb == 2) {
        acc = trellis_row<2, 8, 32>(row, xs, j, g, nb);
      } else if (f32 && kb == 3) {
        acc = trellis_row<3, 8, 32>(row, xs, j, g, nb);
      } else if (f32 && kb == 4) {
        acc = trellis_row<4, 8, 32>(row, xs, j, g, nb);
      } else if (f64 && kb == 2) {
        acc = trellis_row<2, 12, 64>(row, xs, j, g, nb);
      } else if (f64 && kb == 3) {
        acc = trellis_row<3, 12, 64>(row, xs, j, g, nb);
      } else if (f64 && kb == 4) {
        acc = trellis_row<4, 12, 64>(row, xs, j, g, nb);
      } else {
        acc = trellis_row_any(row, xs, j, g, K, kb, L, block, 0);
      }
    }
    // The group's lanes are consecutive (g a power of two): a shuffle tree inside it.
    for (int o = g / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (r < N && j == 0) z[r] = acc * (scales[r] / div);
  }
}

// Before the wait for the previous kernel (the coded weights do not depend on it), each warp
// asks L2 for its first row group's words (trellis_rows' first rows: 32 / lpr consecutive rows
// of K kb / 32 words, one contiguous span), a 128-byte line a lane, so that the product's first
// loads, after the prologue, hit L2 instead of DRAM (the affine matvec's loads before the wait,
// MV_EARLY, without the registers). A hint only: nothing on the CPU emulator.
__device__ __forceinline__ void trellis_prefetch(const u32* W, ll N, ll K, ll kb, ll lpr,
                                                 ll bid) {
#if defined(__CUDA_ARCH__) && TRELLIS_PREFETCH
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const ll rpw = 32 / lpr, wpr = K * kb / 32;
  const ll r0 = (bid * warps + warp) * rpw;
  if (r0 >= N) return;
  const ll rows = N - r0 < rpw ? N - r0 : rpw;
  const char* p = (const char*)(W + r0 * wpr);
  const char* end = p + rows * wpr * 4;
  for (const char* a = (const char*)((u64)p & ~(u64)127) + lane * 128; a < end; a += 32 * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
#endif
}

// The small arrays of a linear that a launch reads after the wait (signs, row scales, the
// norm's weights, the bias: written by no kernel), asked of L2 before it, each 128-byte line by
// one thread of the grid, so that the prologue's and epilogue's reads of them hit L2.
__device__ __forceinline__ void trellis_prefetch_span(const void* p, ll bytes) {
#if defined(__CUDA_ARCH__) && TRELLIS_PREFETCH
  const ll blocks = (ll)gridDim.x * gridDim.y * gridDim.z;
  const ll lb = blockIdx.x + (ll)gridDim.x * (blockIdx.y + (ll)gridDim.y * blockIdx.z);
  const ll stride = blocks * blockDim.x * 128;
  const char* end = (const char*)p + bytes;
  for (const char* a = (const char*)((u64)p & ~(u64)127) + (lb * blockDim.x + threadIdx.x) * 128;
       a < end; a += stride)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
#endif
}

// z[r] = scale[r] / 147.8... * sum_c (byte sum - 510)(state_rc) xh[c] for the N rows of a
// trellis matrix (K inputs, kb bits, L-bit states, blocks of `block`), xh float32 (the
// transformed input, trellis_input's), z float32; sequence blockIdx.y. The input is staged in
// shared memory (K + pad K / 32 floats, dynamic: trellis_xs), the weights streamed. lpr lanes
// a row (1, 2, 4, 8, 16 or 32).
extern "C" __global__ void __launch_bounds__(TRELLIS_THREADS, TRELLIS_MIN_BLOCKS) trellis_matvec(
    const u32* W, const float* scales, const float* xh, float* z, ll N, ll K, ll kb, ll L,
    ll block, ll lpr) {
  float* xs = trellis_xs_base(L, block);
  xh += (ll)blockIdx.y * K;
  z += (ll)blockIdx.y * N;
  trellis_prefetch(W, N, K, kb, lpr, blockIdx.x);
  trellis_lut_fill(L, block);
  pdl_wait_then_release();
  const int pad = trellis_pad(block);
  for (ll c = threadIdx.x; c < K; c += blockDim.x) xs[trellis_xs(c, pad)] = xh[c];
  __syncthreads();
  trellis_rows(W, scales, xs, z, N, K, kb, L, block, lpr, blockIdx.x, gridDim.x);
}

// trellis_matvec with trellis_input in its prologue: every block makes the whole transformed
// input H_c (sv * x) (x = xin, or rms_norm(xin, normw, eps)) in its shared memory, padded as
// trellis_matvec's, with trellis_input's arithmetic in the same order (the same norm
// reduction, the same butterflies), so z is bit-equal to trellis_input then trellis_matvec.
// One launch instead of two, for K * log2(hb) adds a block: where the input is narrow against
// the rows' work (the host's choice).
// The prologue of trellis_matvec_in and trellis_linear: the whole transformed input
// H_c (sv * x) (x = xin, or rms_norm(xin, normw, eps)) in shared memory xs, padded as
// trellis_matvec's, with trellis_input's arithmetic in the same order (the same norm
// reduction, the same butterflies).
__device__ __forceinline__ void trellis_stage_input(float* xs, float* red, const bf16_t* xin,
                                                    const bf16_t* normw, const float* sv, ll K,
                                                    ll block, ll hb, double hscale, ll norm,
                                                    double eps) {
  const int pad = trellis_pad(block);
  const float inv = norm ? trellis_inv_rms(xin, K, eps, red) : 1.f;
  for (int c = threadIdx.x; c < (int)K; c += blockDim.x) {
    float v = bf2f(xin[c]);
    if (norm) v = rbf(bf2f(normw[c]) * rbf(v * inv));
    xs[trellis_pidx(c, pad)] = v * sv[c];
  }
  // trellis_fwht over every Hadamard block of the input at once (each element's adds as
  // there), through the padded index.
  trellis_fwht_pad(xs, (int)K, (int)hb, pad, (float)hscale);
}

// trellis_matvec with trellis_input in its prologue: every block makes the whole transformed
// input in its shared memory (trellis_stage_input), so z is bit-equal to trellis_input then
// trellis_matvec. One launch instead of two, for K * log2(hb) adds a block: where the input
// is narrow against the rows' work (the host's choice).
extern "C" __global__ void __launch_bounds__(TRELLIS_THREADS, TRELLIS_MIN_BLOCKS) trellis_matvec_in(
    const u32* W, const float* scales, const bf16_t* xin, const bf16_t* normw, const float* sv,
    float* z, ll N, ll K, ll kb, ll L, ll block, ll lpr, ll hb, double hscale, ll norm,
    double eps) {
  __shared__ float red[TRELLIS_THREADS / 32];
  float* xs = trellis_xs_base(L, block);
  xin += (ll)blockIdx.y * K;
  z += (ll)blockIdx.y * N;
  trellis_prefetch(W, N, K, kb, lpr, blockIdx.x);
  trellis_lut_fill(L, block);
  pdl_wait_then_release();
  trellis_stage_input(xs, red, xin, normw, sv, K, block, hb, hscale, norm, eps);
  trellis_rows(W, scales, xs, z, N, K, kb, L, block, lpr, blockIdx.x, gridDim.x);
}

// The output transform's Hadamard buffer of an epilogue (TRELLIS_MAX_HB floats, or the
// output's Hadamard block with TRELLIS_ALIAS): with TRELLIS_ALIAS the start of the dynamic
// shared memory, which the host sizes to hold it (graph_trellis.rs, epilogue_shared_bytes).
// Its first write follows the barrier that begins each counting round (trellis_count_round),
// after every warp of the block has left the product (trellis_rows): nothing reads the tables
// or the input after it.
#if TRELLIS_ALIAS
#define TRELLIS_EPILOGUE_BUF float* buf = trellis_lut()
#else
#define TRELLIS_EPILOGUE_BUF __shared__ float buf[TRELLIS_MAX_HB]
#endif

// Output modes (graph_decode.cu's MODE_RES, MODE_SWIGLU, MODE_F32 values).
// y = su * H_r z for Hadamard block blockIdx.x (hb rows), sequence blockIdx.y, then
// v = bfloat16(y) (+ bias, rounded), and
// - no mode: out = v (bfloat16);
// - MODE_RES: out = res + v (bfloat16; out may be res: each element read and written by one
//   thread);
// - MODE_SWIGLU: out = silu(res) * v (res the gate's output, this the up projection's; the
//   rounding of graph_decode.cu's SwiGLU epilogue);
// - MODE_F32: out = v as float32; with MODE_F32 | TRELLIS_RAW the unrounded float32 y (the
//   transform's own bits, for the L2 check).
// The bias is read only with TRELLIS_BIAS (the runtime passes no null pointers).
#define TRELLIS_RAW 32
#define TRELLIS_BIAS 64
// Hadamard block [r0, r0 + hb) of sequence b's output from its z (read through L2: another
// block may have written it), as the modes above say; buf is the block's shared scratch.
__device__ __forceinline__ void trellis_output_block(const float* z, const float* su,
                                                     const bf16_t* bias, const bf16_t* res,
                                                     void* out, ll N, ll hb, double hscale,
                                                     ll mode, ll r0, ll b, float* buf) {
  z += b * N;
  for (int i = threadIdx.x; i < hb; i += blockDim.x) buf[i] = __ldcg(z + r0 + i);
  trellis_fwht(buf, (int)hb, (float)hscale);
  for (int i = threadIdx.x; i < hb; i += blockDim.x) {
    const ll r = r0 + i;
    const float y = buf[i] * su[r];
    if ((mode & MODE_F32) && (mode & TRELLIS_RAW)) {
      ((float*)out)[b * N + r] = y;
      continue;
    }
    float v = rbf(y);
    if (mode & TRELLIS_BIAS) v = rbf(v + bf2f(bias[r]));
    if (mode & MODE_F32) {
      ((float*)out)[b * N + r] = v;
    } else if (mode & MODE_RES) {
      ((bf16_t*)out)[b * N + r] = f2bf(bf2f(res[b * N + r]) + v);
    } else if (mode & MODE_SWIGLU) {
      const float g = bf2f(res[b * N + r]);
      const float sg = rbf(1.f / (1.f + expf(-g)));
      ((bf16_t*)out)[b * N + r] = f2bf(rbf(g * sg) * v);
    } else {
      ((bf16_t*)out)[b * N + r] = f2bf(v);
    }
  }
  __syncthreads();
}

extern "C" __global__ void __launch_bounds__(TRELLIS_THREADS) trellis_output(
    const float* z, const float* su, const bf16_t* bias, const bf16_t* res, void* out, ll N,
    ll hb, double hscale, ll mode) {
  __shared__ float buf[TRELLIS_MAX_HB];
  pdl_wait_then_release();
  trellis_output_block(z, su, bias, res, out, N, hb, hscale, mode, (ll)blockIdx.x * hb,
                       blockIdx.y, buf);
}

// Segments a counting round of the epilogues takes at most (trellis_count_round): the size of
// the list of Hadamard blocks a round completes.
#define TRELLIS_ROUND 128

// The epilogues' counting (after the block's rows of z are written and fenced, and a
// barrier): the block's rows are chunks of RB consecutive rows, RB apart by the grid, each in
// S = max(1, RB / hb) segments of one Hadamard block of rows (RB and hb powers of two, chunks
// aligned to RB). Round g0 counts segments g0 .. g0 + TRELLIS_ROUND of the block, a thread a
// segment, all the atomics in flight together (they were one after another, each behind two
// barriers); a thread whose add completes a Hadamard block (its count reaches target) sets
// the count back to zero for the next launch and lists the block in done. Returns how many
// it listed, after a barrier (the caller transforms them, then a barrier before the next
// round). Which block completes a Hadamard block, and so the bits, are as before: the
// transform reads z whole.
__device__ __forceinline__ ll trellis_segments(ll N, ll RB, ll hb, ll bid, ll nbk) {
  const ll chunks = bid * RB < N ? (N - bid * RB - 1) / (nbk * RB) + 1 : 0;
  return chunks * (RB > hb ? RB / hb : 1);
}

__device__ __forceinline__ int trellis_count_round(int* counts, ll N, ll RB, ll hb, int target,
                                                   ll g0, int* done, int* ndone, ll bid, ll nbk) {
  if (threadIdx.x == 0) *ndone = 0;
  __syncthreads();
  const ll S = RB > hb ? RB / hb : 1;
  const ll g = g0 + threadIdx.x;
  if (threadIdx.x < TRELLIS_ROUND && g < trellis_segments(N, RB, hb, bid, nbk)) {
    const ll c = (bid + (g / S) * nbk) * RB;
    const ll a = c + (g % S) * hb, e = c + RB < N ? c + RB : N;
    if (a < e) {
      const ll h = a / hb, end = (h + 1) * hb < e ? (h + 1) * hb : e;
      const int n = (int)(end - a);
      if (atomicAdd(counts + h, n) + n == target) {
        __threadfence();
        atomicExch(counts + h, 0);
        done[atomicAdd(ndone, 1)] = (int)h;
      }
    }
  }
  __syncthreads();
  return *ndone;
}

// The epilogue of trellis_matvec_out and trellis_linear, after the block's rows of z
// (sequence b) are written: the block counts them into their Hadamard blocks of rows (counts:
// one int a Hadamard block and sequence, zero before the launch); the block whose rows complete
// a Hadamard block applies the output transform and the following op to it (the same
// arithmetic as trellis_output, so the same bits), and sets its count back to zero for the next
// launch (a replayed graph). As attention's combine by the last block: every writer fences its
// z before the count, the completing block reads z through L2.
__device__ __forceinline__ void trellis_finish(const float* z, int* counts, const float* su,
                                               const bf16_t* bias, const bf16_t* res, void* out,
                                               ll N, ll lpr, ll hb, double hscale, ll mode, ll b,
                                               float* buf, int* done, int* ndone) {
  __threadfence();
  // The block's rows: chunks of RB consecutive rows, RB apart by the grid (trellis_rows').
  const ll RB = (ll)(blockDim.x >> 5) * (32 / lpr), nhb = N / hb;
  const ll bid = blockIdx.x, nbk = gridDim.x;
  const ll segs = trellis_segments(N, RB, hb, bid, nbk);
  for (ll g0 = 0; g0 < segs; g0 += TRELLIS_ROUND) {
    const int nd =
        trellis_count_round(counts + b * nhb, N, RB, hb, (int)hb, g0, done, ndone, bid, nbk);
    for (int i = 0; i < nd; ++i)
      trellis_output_block(z, su, bias, res, out, N, hb, hscale, mode, (ll)done[i] * hb, b, buf);
    __syncthreads();
  }
}

// trellis_matvec with trellis_output in its epilogue: each block writes its rows of z, then
// counts them into their Hadamard blocks of rows (counts: one int a Hadamard block and
// sequence, zero before the launch); the block whose rows complete a Hadamard block applies
// the output transform and the following op to it (the same arithmetic as trellis_output, so
// the same bits), and sets its count back to zero for the next launch (a replayed graph). As
// attention's combine by the last block: every writer fences its z before the count, the
// completing block reads z through L2.
extern "C" __global__ void __launch_bounds__(TRELLIS_THREADS) trellis_matvec_out(
    const u32* W, const float* scales, const float* xh, float* z, int* counts, const float* su,
    const bf16_t* bias, const bf16_t* res, void* out, ll N, ll K, ll kb, ll L, ll block,
    ll lpr, ll hb, double hscale, ll mode) {
  TRELLIS_EPILOGUE_BUF;
  __shared__ int done[TRELLIS_ROUND], ndone;
  float* xs = trellis_xs_base(L, block);
  const ll b = blockIdx.y;
  xh += b * K;
  trellis_prefetch(W, N, K, kb, lpr, blockIdx.x);
  trellis_lut_fill(L, block);
  pdl_wait_then_release();
  const int pad = trellis_pad(block);
  for (ll c = threadIdx.x; c < K; c += blockDim.x) xs[trellis_xs(c, pad)] = xh[c];
  __syncthreads();
  trellis_rows(W, scales, xs, z + b * N, N, K, kb, L, block, lpr, blockIdx.x, gridDim.x);
  trellis_finish(z, counts, su, bias, res, out, N, lpr, hb, hscale, mode, b, buf, done, &ndone);
}

// A whole trellis-coded linear in one launch: trellis_matvec_in's prologue (the input's norm,
// signs and Hadamard blocks, every block for the whole input), the product, and
// trellis_matvec_out's epilogue (the output's Hadamard blocks, signs, rounding and op by the
// block completing each Hadamard block of rows). Bit-equal to trellis_input, trellis_matvec,
// trellis_output. The graph decoder's step launches one a linear (graph_decode.rs,
// record_trellis_*); counts: one int a Hadamard block of rows and sequence, zero between
// launches.
extern "C" __global__ void __launch_bounds__(TRELLIS_FUSED_THREADS) trellis_linear(
    const u32* W, const float* scales, const bf16_t* xin, const bf16_t* normw, const float* sv,
    float* z, int* counts, const float* su, const bf16_t* bias, const bf16_t* res, void* out,
    ll N, ll K, ll kb, ll L, ll block, ll lpr, ll hbc, double hscalec, ll norm, double eps,
    ll hbr, double hscaler, ll mode) {
  TRELLIS_EPILOGUE_BUF;
  __shared__ float red[TRELLIS_THREADS / 32];
  __shared__ int done[TRELLIS_ROUND], ndone;
  float* xs = trellis_xs_base(L, block);
  const ll b = blockIdx.y;
  xin += b * K;
  trellis_prefetch(W, N, K, kb, lpr, blockIdx.x);
  trellis_lut_fill(L, block);
  trellis_prefetch_span(sv, 4 * K);
  trellis_prefetch_span(scales, 4 * N);
  trellis_prefetch_span(su, 4 * N);
  if (norm) trellis_prefetch_span(normw, 2 * K);
  if (mode & TRELLIS_BIAS) trellis_prefetch_span(bias, 2 * N);
  pdl_wait_then_release();
  trellis_stage_input(xs, red, xin, normw, sv, K, block, hbc, hscalec, norm, eps);
  trellis_rows(W, scales, xs, z + b * N, N, K, kb, L, block, lpr, blockIdx.x, gridDim.x);
  trellis_finish(z, counts, su, bias, res, out, N, lpr, hbr, hscaler, mode, b, buf, done, &ndone);
}

// RoPE on q (in place) and k, and k and v into the caches at position state[1], after the
// trellis q/k/v linears wrote q, k and v unrotated in their natural order to qkv ([q; k; v]
// as matvec_qkv lays them out: the output transform mixes rows, so the rows cannot be paired
// for RoPE as matvec_qkv's are). Block j < nh: q's head j; then k's heads; then v's. Pairs
// (i, i + nrot), or (2i, 2i + 1) when traditional, rotated as matvec_qkv's epilogue rotates
// them (rope: the step's cosines then sines, embed's). 128 threads, D <= 128. One sequence.
extern "C" __global__ void __launch_bounds__(128) trellis_rope_qkv(
    bf16_t* qkv, bf16_t* kc, bf16_t* vc, const int* state, const float* rope, ll nh, ll nkv,
    ll D, ll cap, ll nrot, ll traditional) {
  __shared__ float xs[128];
  pdl_wait_then_release();
  const int t = threadIdx.x, Di = (int)D, half = Di / 2, nr = (int)nrot;
  const ll j = blockIdx.x;
  const int pos = state[1];
  if (pos < 0) return;  // an idle row
  bf16_t* x = qkv + j * D;
  const float v = t < Di ? bf2f(x[t]) : 0.f;
  if (t < Di) xs[t] = v;
  __syncthreads();
  if (t >= Di) return;
  if (j >= nh + nkv) {
    vc[((j - nh - nkv) * cap + pos) * D + t] = f2bf(v);
    return;
  }
  float o = v;
  if (traditional) {
    const int i = t / 2;
    if (i < nr) {
      const float c = rope[i], s = rope[half + i];
      const float x1 = xs[2 * i], x2 = xs[2 * i + 1];
      o = (t & 1) ? x1 * s + x2 * c : x1 * c - x2 * s;
    }
  } else if (t < 2 * nr) {
    const int i = t < nr ? t : t - nr;
    const float c = rope[i], s = rope[half + i];
    const float x1 = xs[i], x2 = xs[i + nr];
    o = t < nr ? x1 * c - x2 * s : x1 * s + x2 * c;
  }
  if (j < nh) {
    x[t] = f2bf(o);
  } else {
    kc[((j - nh) * cap + pos) * D + t] = f2bf(o);
  }
}

// Hadamard block [h0, h0 + hb) of slice zsl's rows (0 q, 1 k, 2 v) of trellis_qkv: the output
// transform, signs, rounding and bias of trellis_output (mode 0), then in the block's shared
// buffer RoPE as trellis_rope_qkv applies it (a head lies within one Hadamard block: D and the
// block are powers of two, D divides the rows) and the write: q to qout, k and v into the
// caches at position pos. The same bits as trellis_linear (mode 0) then trellis_rope_qkv.
__device__ __forceinline__ void trellis_qkv_block(const float* z, const float* su,
                                                  const bf16_t* bias, bf16_t* qout, bf16_t* kc,
                                                  bf16_t* vc, const float* rope, ll D, ll cap,
                                                  ll nrot, ll traditional, ll hb, double hscale,
                                                  ll h0, ll zsl, int pos, float* buf) {
  for (int i = threadIdx.x; i < hb; i += blockDim.x) buf[i] = __ldcg(z + h0 + i);
  trellis_fwht(buf, (int)hb, (float)hscale);
  for (int i = threadIdx.x; i < hb; i += blockDim.x) {
    const ll r = h0 + i;
    float v = rbf(buf[i] * su[r]);
    if (bias) v = rbf(v + bf2f(bias[r]));
    buf[i] = v;
  }
  __syncthreads();
  const int Di = (int)D, half = Di / 2, nr = (int)nrot;
  for (int i = threadIdx.x; i < hb; i += blockDim.x) {
    const ll r = h0 + i, head = r / D;
    const int t = (int)(r % D);
    const float* xs = buf + (i - t);  // the head's values
    float o = xs[t];
    if (zsl < 2) {
      if (traditional) {
        const int j = t / 2;
        if (j < nr) {
          const float c = rope[j], s = rope[half + j];
          const float x1 = xs[2 * j], x2 = xs[2 * j + 1];
          o = (t & 1) ? x1 * s + x2 * c : x1 * c - x2 * s;
        }
      } else if (t < 2 * nr) {
        const int j = t < nr ? t : t - nr;
        const float c = rope[j], s = rope[half + j];
        const float x1 = xs[j], x2 = xs[j + nr];
        o = t < nr ? x1 * c - x2 * s : x1 * s + x2 * c;
      }
    }
    if (zsl == 0) {
      qout[r] = f2bf(o);
    } else if (pos >= 0) {
      (zsl == 1 ? kc : vc)[(head * cap + pos) * D + t] = f2bf(o);
    }
  }
  __syncthreads();
}

// k's and v's blocks each of a flat trellis_qkv grid of `total` blocks (at least 3): their
// share of the rows, at least one; q takes the rest (graph_trellis.rs, qkv_kv_blocks).
__device__ __forceinline__ ll trellis_qkv_kv_blocks(ll total, ll Nq, ll Nk) {
  const ll bk = total * Nk / (Nq + 2 * Nk);
  return bk < 1 ? 1 : bk;
}

// q, k and v of a trellis layer in one launch (one sequence): slice blockIdx.z of the grid
// (0 q, 1 k, 2 v) is trellis_linear over that matrix's rows of the side-by-side words, row
// scales, signs su and bias ([q; k; v] rows; sv: the three input sign vectors, K each; counts:
// each matrix's Hadamard blocks of rows in turn), the input norm in its prologue; its epilogue
// (trellis_qkv_block) applies RoPE and writes q to qout, k and v into the caches at position
// state[1]. Bit-equal to three trellis_linear launches then trellis_rope_qkv (the emulator's
// L2 check). bias: null for none. Compiled with TRELLIS_QKV_FLAT (MLX_GRAPH_TRELLIS_SPLIT=1 or
// wider fused blocks: graph_trellis.rs, qkv_flat), it runs on a flat grid whose slices take
// blocks in proportion to their rows (an 8B layer's q has four times k's rows: on three equal
// slices q's blocks do four times the others' rows); each row is summed by one warp as
// before: the same bits.
// A model whose value projections take their own code (GraphSpec::trellis_v: mlx convert
// --q-trellis-v-code) is compiled with TRELLIS_V_L, v's L argument (l_arg: its L and code):
// the v slice's blocks decode with it (their tables, the input's place after them, the
// product's path), q's and k's with L. The bits, the blocks and the lanes a row are the
// launch's for all three (graph_trellis.rs, v_spec_problem); the launch's dynamic shared
// memory is the larger of the two plans'. Undefined (one spec a model), the kernel is as before.
extern "C" __global__ void __launch_bounds__(TRELLIS_FUSED_THREADS, TRELLIS_FUSED_MIN_BLOCKS) trellis_qkv(
    const u32* W, const float* scales, const bf16_t* xin, const bf16_t* normw, const float* sv,
    float* z, int* counts, const float* su, const bf16_t* bias, bf16_t* qout, bf16_t* kc,
    bf16_t* vc, const int* state, const float* rope, ll nh, ll nkv, ll D, ll cap, ll nrot,
    ll traditional, ll K, ll kb, ll L, ll block, ll lpr_q, ll lpr_kv, ll hbc, double hscalec,
    double eps, double hscale_q, double hscale_kv, ll has_bias) {
  TRELLIS_EPILOGUE_BUF;
  __shared__ float red[TRELLIS_THREADS / 32];
  __shared__ int done[TRELLIS_ROUND], ndone;
  const ll Nq = nh * D, Nk = nkv * D;
  // The slice (0 q, 1 k, 2 v) and the block's place in it: blockIdx.z of a grid of three
  // slices of gridDim.x blocks, or with TRELLIS_QKV_FLAT on a flat grid
  // (trellis_qkv_kv_blocks) q's blocks, then k's, then v's, in proportion to their rows.
#if TRELLIS_QKV_FLAT
  const ll bk = trellis_qkv_kv_blocks(gridDim.x, Nq, Nk), bq = (ll)gridDim.x - 2 * bk;
  const ll zsl = (ll)blockIdx.x < bq ? 0 : (ll)blockIdx.x < bq + bk ? 1 : 2;
  const ll bid = (ll)blockIdx.x - (zsl == 0 ? 0 : bq + (zsl - 1) * bk);
  const ll nbk = zsl == 0 ? bq : bk;
#else
  const ll zsl = blockIdx.z, bid = blockIdx.x, nbk = gridDim.x;
#endif
#ifdef TRELLIS_V_L
  if (zsl == 2) L = TRELLIS_V_L;
#endif
  float* xs = trellis_xs_base(L, block);
  const ll N = zsl == 0 ? Nq : Nk, r0 = zsl == 0 ? 0 : zsl == 1 ? Nq : Nq + Nk;
  const ll lpr = zsl == 0 ? lpr_q : lpr_kv;
  const ll hbq = (Nq & -Nq) < TRELLIS_MAX_HB ? (Nq & -Nq) : TRELLIS_MAX_HB;
  const ll hbk = (Nk & -Nk) < TRELLIS_MAX_HB ? (Nk & -Nk) : TRELLIS_MAX_HB;
  const ll hb = zsl == 0 ? hbq : hbk;
  const double hs = zsl == 0 ? hscale_q : hscale_kv;
  int* cnt = counts + (zsl == 0 ? 0 : zsl == 1 ? Nq / hbq : Nq / hbq + Nk / hbk);
  const ll wpr = K * kb / 32;
  trellis_prefetch(W + r0 * wpr, N, K, kb, lpr, bid);
  trellis_lut_fill(L, block);
  trellis_prefetch_span(sv, 12 * K);
  trellis_prefetch_span(scales, 4 * (Nq + 2 * Nk));
  trellis_prefetch_span(su, 4 * (Nq + 2 * Nk));
  trellis_prefetch_span(normw, 2 * K);
  if (has_bias) trellis_prefetch_span(bias, 2 * (Nq + 2 * Nk));
  pdl_wait_then_release();
  const int pos = state[1];
  trellis_stage_input(xs, red, xin, normw, sv + zsl * K, K, block, hbc, hscalec, 1, eps);
  trellis_rows(W + r0 * wpr, scales + r0, xs, z + r0, N, K, kb, L, block, lpr, bid, nbk);
  __threadfence();
  // trellis_finish's counting, over this slice's rows.
  const ll RB = (ll)(blockDim.x >> 5) * (32 / lpr);
  const ll segs = trellis_segments(N, RB, hb, bid, nbk);
  for (ll g0 = 0; g0 < segs; g0 += TRELLIS_ROUND) {
    const int nd = trellis_count_round(cnt, N, RB, hb, (int)hb, g0, done, &ndone, bid, nbk);
    for (int i = 0; i < nd; ++i)
      trellis_qkv_block(z + r0, su + r0, has_bias ? bias + r0 : nullptr, qout + r0, kc, vc, rope,
                        D, cap, nrot, traditional, hb, hs, (ll)done[i] * hb, zsl, pos, buf);
    __syncthreads();
  }
}

// Gate and up of a trellis layer in one launch (one sequence): slice blockIdx.z of the grid
// (0 gate, 1 up) is trellis_linear over that matrix's rows of the side-by-side words, row
// scales and signs su ([gate; up] rows; sv: the two input sign vectors, K each), the
// post-attention norm in its prologue. Hadamard block h of rows is counted over both slices
// (counts[h] reaches 2 hb); the block completing it applies trellis_output to gate's rows
// (mode 0, bfloat16 to g) and then to up's (MODE_SWIGLU with g, to act): the same functions
// as two trellis_linear launches, so the same bits.
extern "C" __global__ void __launch_bounds__(TRELLIS_FUSED_THREADS) trellis_gate_up(
    const u32* W, const float* scales, const bf16_t* xin, const bf16_t* normw, const float* sv,
    float* z, int* counts, const float* su, bf16_t* g, bf16_t* act, ll N, ll K, ll kb, ll L,
    ll block, ll lpr, ll hbc, double hscalec, double eps, ll hbr, double hscaler) {
  TRELLIS_EPILOGUE_BUF;
  __shared__ float red[TRELLIS_THREADS / 32];
  __shared__ int done[TRELLIS_ROUND], ndone;
  float* xs = trellis_xs_base(L, block);
  const ll zsl = blockIdx.z, r0 = zsl * N, wpr = K * kb / 32;
  trellis_prefetch(W + r0 * wpr, N, K, kb, lpr, blockIdx.x);
  trellis_lut_fill(L, block);
  trellis_prefetch_span(sv, 8 * K);
  trellis_prefetch_span(scales, 8 * N);
  trellis_prefetch_span(su, 8 * N);
  trellis_prefetch_span(normw, 2 * K);
  pdl_wait_then_release();
  trellis_stage_input(xs, red, xin, normw, sv + zsl * K, K, block, hbc, hscalec, 1, eps);
  trellis_rows(W + r0 * wpr, scales + r0, xs, z + r0, N, K, kb, L, block, lpr, blockIdx.x,
               gridDim.x);
  __threadfence();
  const ll RB = (ll)(blockDim.x >> 5) * (32 / lpr);
  const ll segs = trellis_segments(N, RB, hbr, blockIdx.x, gridDim.x);
  for (ll g0 = 0; g0 < segs; g0 += TRELLIS_ROUND) {
    const int nd = trellis_count_round(counts, N, RB, hbr, 2 * (int)hbr, g0, done, &ndone,
                                       blockIdx.x, gridDim.x);
    for (int i = 0; i < nd; ++i) {
      const ll h0 = (ll)done[i] * hbr;
      trellis_output_block(z, su, nullptr, nullptr, g, N, hbr, hscaler, 0, h0, 0, buf);
      trellis_output_block(z + N, su + N, nullptr, g, act, N, hbr, hscaler, MODE_SWIGLU, h0, 0,
                           buf);
    }
    __syncthreads();
  }
}
