"""Runs the CUDA trellis kernels (`mlx-kernels/src/graph_trellis.cu`) on the CPU, here, without
a GPU, against the Rust CPU references, on seeded random trellis matrices at SmolLM2-135M's
shapes:

    cargo run -p mlx-kernels --example trellis_reference -- /tmp/trellis-ref
    [TRELLIS_EMU_RESIDENT=N] [TRELLIS_ROWS2=1] [TRELLIS_ALIAS=1] [TRELLIS_PIPE=1] \
      [TRELLIS_STATES=1] [TRELLIS_PAIR=1] [TRELLIS_EMU_DEFINES=FILE] \
      python3 xtask/gpu/trellis_emulate.py /tmp/trellis-ref [CASE ...]

As `graph_emulate.py` does (its prelude and `__shared__`/barrier/shuffle emulation), the exact
source (graph_decode.cu, whose helpers it uses, then graph_trellis.cu) is compiled as C++ with
each CUDA block run as its threads (std::thread). Needs g++ (C++20) and numpy; not mlx.

Cases of six codes (`meta.json`'s `code`: 1mad; 1mad8, whose fast paths at L 8 read a table
in shared memory; 1mad8h, whose fast paths at L 12 read the same table at each state's hashed
index; the S-box codes 1mad8s, gauss8s and gauss7s, whose fast paths at L 12 read the AES
S-box of the state's top byte and then the code's table, both in shared memory); the kernels'
L argument carries the code (graph_trellis.rs, l_arg).

TRELLIS_EMU_MUTATE=fast|index|sbox runs a broken source, to show the checks catch a wrong 1mad8h
index: `fast` drops the top byte from the table path's index (the multiply by 128 + 2^(15 - L)
becomes one by 128: the index is the bottom byte alone, 1mad8's window), `index` makes the
general path's and the decoder's index the top byte xor the bottom byte (no carries). Every
1mad8h case of the mutated path must then FAIL (the integer check, and the decode for `index`).
TRELLIS_EMU_MUTATE=sbox drops the S-box from the S-box codes' table path (the index becomes
1mad8h's, top byte plus bottom byte): every S-box case on that path (L 12, blocks of 32 or 64)
must then FAIL its integer check. TRELLIS_EMU_MUTATE=states (with TRELLIS_STATES=1) reads byte 0 of
every word of the states' table (the state's low two bits dropped): every S-box case on that
path must then FAIL its integer check.

Checks, per case (`trellis_reference.rs` names the references):
- L2: `trellis_decode` equals `cpu::trellis::decode_row` bit for bit;
- L2: `trellis_input` (no norm) equals `fwht_blocks(sv * x)` bit for bit;
- L2: `trellis_output` (float32, unrounded) on the CPU kernel's `z` equals `su * fwht_blocks(z)`
  bit for bit, and its bfloat16 output is that rounded (ties to even);
- L3: `trellis_matvec` at several lanes-a-row (the host's choice, 1, 4 and 32) against the
  float64 product of the decoded matrix, within the rounding bound of its sums (below);
- L2: `trellis_matvec` on small integer inputs (-2..2), whose partial sums are exact integers
  below 2^24 in any order: float32(sum code * x) * float32(scale / divisor) bit for bit, each
  weight's code read back from the decoded matrix (1mad8's table and 1mad8h's indices checked
  code by code);
- L3: the whole linear (`trellis_input` -> `trellis_matvec` -> `trellis_output`) against the CPU
  decoder's `TrellisView::matvec`, within the two products' bounds carried through the output
  transform;
- L3: `trellis_input` with the RMSNorm prologue against a float64 norm, within bfloat16 rounding;
- L2: `trellis_matvec_in` (the input transform, with and without the norm, in the product's
  prologue) equals `trellis_input` then `trellis_matvec` bit for bit;
- L2: `trellis_matvec_out` (the output transform and its op by the last block of each Hadamard
  block of rows) equals `trellis_matvec` then `trellis_output` bit for bit, and leaves its
  counts at zero. Blocks run one after another here, so this checks the counting and the
  arithmetic, not the GPU's memory ordering (the fences).

The product's bound: every code is an exact integer (|c| <= 510) and every input a float32, so
each FMA rounds once; a lane's sum is two FMA chains of at most m = ceil(blocks / lpr) *
block / 2 steps (the general path: one chain of ceil(K / lpr)), then at most ceil(blocks / lpr)
adds of its blocks, log2(lpr) shuffle adds and the two roundings of scale / 147.8... and the
product. So |z - z64| <= (m + blocks a lane + log2(lpr) + 3) * 2^-24 * S + 2^-23 * S, with S =
sum |decoded * xh| in float64 (the last term: the decoded matrix's own rounding, two per
weight). The CPU kernel's sum is bounded the same way with 16 lanes (K / 16 + 16 steps).
"""
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
import ctypes

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CU = "".join((ROOT / "mlx-kernels" / "src" / f).read_text() for f in ("graph_decode.cu", "graph_trellis.cu"))
# TRELLIS_ROWS2=1: the source as MLX_GRAPH_TRELLIS_ROWS2=1 compiles it (1mad8's two rows a lane);
# TRELLIS_ALIAS=1 and TRELLIS_PIPE=1 as MLX_GRAPH_TRELLIS_ALIAS=1 and MLX_GRAPH_TRELLIS_PIPE=1 do
# (the epilogues' Hadamard buffer over the dynamic shared memory; the next block's words loaded
# before the current one's codes); TRELLIS_STATES=1 as MLX_GRAPH_TRELLIS_STATES=1 (the S-box
# codes' fast paths from one table of the 12-bit states' codes), TRELLIS_PAIR=1 as
# MLX_GRAPH_TRELLIS_PAIR=1 (two blocks' loads before their codes): every check below then runs on
# that source.
# TRELLIS_EMU_DEFINES=FILE instead: the host's defines for a model (graph_trellis.rs
# `TrellisSwitches::defines`, as graph_decode.rs's `step_sources_dump` test writes them for a hidden
# width: `defines4096.txt`), verbatim after graph_decode.cu, as `TrellisSwitches::source` puts them.
_SWITCHES = ("TRELLIS_ROWS2", "TRELLIS_ALIAS", "TRELLIS_PIPE", "TRELLIS_STATES", "TRELLIS_PAIR")
if os.environ.get("TRELLIS_EMU_DEFINES"):
    if any(_d in os.environ for _d in _SWITCHES):
        sys.exit("TRELLIS_EMU_DEFINES with a TRELLIS_* switch variable: one or the other")
    _host = Path(os.environ["TRELLIS_EMU_DEFINES"]).read_text()
    _dec, _tre = ((ROOT / "mlx-kernels" / "src" / f).read_text() for f in ("graph_decode.cu", "graph_trellis.cu"))
    CU = _dec + _host + _tre
    print(f"TRELLIS_EMU_DEFINES: {_host.splitlines() or 'none (the kernels own defaults)'}")
for _d in _SWITCHES:
    if os.environ.get(_d) == "1":
        CU = f"#define {_d} 1\n" + CU
# TRELLIS_EMU_MUTATE: a wrong 1mad8h index (the module doc), for the checks' own check.
MUTATIONS = {
    "fast": ("const u32 h = st * (128u + (1u << (15 - L)));", "const u32 h = st * 128u;"),
    "index": ("return ((state >> (L - 8)) + state) & 0xFFu;", "return ((state >> (L - 8)) ^ state) & 0xFFu;"),
    "sbox": ("const u32 h = sb * (1u << (L - 8)) + s7;", "const u32 h = sb * (1u << (L - 8)) + (sb & 0x7F80u);"),
    "states": ("((sb >> 5) & 3u) | 0x7650u", "0x7650u"),
}
MUTATE = os.environ.get("TRELLIS_EMU_MUTATE")
if MUTATE:
    _a, _b = MUTATIONS[MUTATE]
    assert CU.count(_a) == 1, f"the mutation {MUTATE!r} no longer matches the source"
    CU = CU.replace(_a, _b)

# The prelude of graph_emulate.py (CUDA as C++), without importing it (it needs mlx).
_EMU = (HERE / "graph_emulate.py").read_text()
PRE = _EMU[_EMU.index('PRE = r"""') + len('PRE = r"""'):]
PRE = PRE[:PRE.index('"""')]
# What graph_trellis.cu adds to what graph_decode.cu uses.
PRE += r"""
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
  for (int i = 0; i < 4; ++i) c += ((a >> (8 * i)) & 0xFF) * ((b >> (8 * i)) & 0xFF);
  return c;
}
inline float __shfl_sync(unsigned, float v, int src) {
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  g_fs[w][l] = v;
  g_wbar[w]->arrive_and_wait();
  const float r = g_fs[w][src & 31];
  g_wbar[w]->arrive_and_wait();
  return r;
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
  return (unsigned)((((unsigned long long)hi << 32) | lo) >> (s & 31));
}
"""

LAUNCH = r"""
template <class F> void run_grid(unsigned gx, unsigned gy, unsigned bx, F f) {
  gridDim = {gx, gy, 1};
  blockDim = {bx, 1, 1};
  for (unsigned y = 0; y < gy; ++y)
    for (unsigned x = 0; x < gx; ++x) {
      std::barrier<> bar(bx);
      g_bar = &bar;
      std::vector<std::barrier<>*> wb;
      for (unsigned w = 0; w < (bx + 31) / 32; ++w) { wb.push_back(new std::barrier<>(32)); g_wbar[w] = wb.back(); }
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < bx; ++t)
        ts.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {x, y, 0}; f(); });
      for (auto& t : ts) t.join();
      for (auto* b : wb) delete b;
    }
}
#define P(T, i) ((T)(uintptr_t)a[i])
#define L(i) ((long long)a[i])
inline double D_(u64 v) { double d; std::memcpy(&d, &v, 8); return d; }
extern "C" void emu(int k, unsigned gx, unsigned gy, unsigned bx, const u64* a) {
  switch (k) {
    case 0: run_grid(gx, gy, bx, [=] { trellis_decode(P(const u32*, 0), P(const float*, 1), P(float*, 2), L(3), L(4), L(5), L(6), L(7)); }); break;
    case 1: run_grid(gx, gy, bx, [=] { trellis_input(P(const bf16_t*, 0), P(const bf16_t*, 1), P(const float*, 2), P(float*, 3), L(4), L(5), D_(a[6]), L(7), D_(a[8])); }); break;
    case 2: run_grid(gx, gy, bx, [=] { trellis_matvec(P(const u32*, 0), P(const float*, 1), P(const float*, 2), P(float*, 3), L(4), L(5), L(6), L(7), L(8), L(9)); }); break;
    case 4: run_grid(gx, gy, bx, [=] { trellis_matvec_in(P(const u32*, 0), P(const float*, 1), P(const bf16_t*, 2), P(const bf16_t*, 3), P(const float*, 4), P(float*, 5), L(6), L(7), L(8), L(9), L(10), L(11), L(12), D_(a[13]), L(14), D_(a[15])); }); break;
    case 5: run_grid(gx, gy, bx, [=] { trellis_matvec_out(P(const u32*, 0), P(const float*, 1), P(const float*, 2), P(float*, 3), P(int*, 4), P(const float*, 5), P(const bf16_t*, 6), P(const bf16_t*, 7), P(void*, 8), L(9), L(10), L(11), L(12), L(13), L(14), L(15), D_(a[16]), L(17)); }); break;
    case 3: run_grid(gx, gy, bx, [=] { trellis_output(P(const float*, 0), P(const float*, 1), P(const bf16_t*, 2), P(const bf16_t*, 3), P(void*, 4), L(5), L(6), D_(a[7]), L(8)); }); break;
  }
}
"""

THREADS = 256  # TRELLIS_THREADS
# The grid cap of trellis_matvec here (the GPU's resident blocks): small, so that warps stride
# over several row groups as on the GPU for large matrices.
RESIDENT = int(os.environ.get("TRELLIS_EMU_RESIDENT", "3"))
MODE_RES, MODE_F32, MODE_RAW = 2, 8, 32
SMS = 132  # lanes_per_row's multiprocessors (H100 SXM; the H200 has as many)


def lanes_per_row(rows, cols, block, fast, sms=SMS):
    """graph_trellis.rs's `lanes_per_row` (the host's choice; the kernels are correct for any)."""
    if not fast:
        return 32
    nb = cols // block
    best, best_score = 32, -1.0
    for g in (32, 16, 8, 4, 2, 1):
        eff = nb / (math.ceil(nb / g) * g)
        fill = min(1.0, rows * g / 32 / (4 * sms))
        score = eff * fill
        if score > best_score + 1e-12:
            best, best_score = g, score
    return best


def build(tmp):
    src = CU.replace("extern __shared__ __align__(16) unsigned char smem[];", "unsigned char* smem = g_smem;")
    cpp, so = os.path.join(tmp, "trellis.cpp"), os.path.join(tmp, "trellis.so")
    open(cpp, "w").write(PRE + src + LAUNCH)
    subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-fPIC", "-shared", "-pthread", cpp, "-o", so], check=True)
    lib = ctypes.CDLL(so)
    lib.emu.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_uint64)]
    return lib


def launch(lib, k, grid, block, args, keep):
    vals = []
    for x in args:
        if x is None:
            vals.append(0)
        elif isinstance(x, np.ndarray):
            assert x.flags["C_CONTIGUOUS"]
            keep.append(x)
            vals.append(x.ctypes.data)
        elif isinstance(x, float):
            vals.append(int(np.float64(x).view(np.uint64)))
        else:
            vals.append(int(x) & 0xFFFFFFFFFFFFFFFF)
    lib.emu(k, grid[0], grid[1], block, (ctypes.c_uint64 * len(vals))(*vals))


def to_bf16_bits(f):
    """float32 values (already bfloat16 values) as bfloat16 bits."""
    return (np.ascontiguousarray(f, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def rbf_np(f):
    """float32 to the nearest bfloat16 (ties to even), as float32."""
    u = np.ascontiguousarray(f, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return r.view(np.float32)


def bits_equal(a, b):
    return np.array_equal(np.ascontiguousarray(a, np.float32).view(np.uint32),
                          np.ascontiguousarray(b, np.float32).view(np.uint32))


def matvec_bound(S, nb, block, K, g, fast):
    """The rounding bound of trellis_matvec's row sums (see the module doc)."""
    if fast:
        per_lane = math.ceil(nb / g)
        steps = per_lane * (block // 2) + per_lane + int(math.log2(g)) + 3
    else:
        steps = math.ceil(K / g) + int(math.log2(g)) + 3
    return steps * 2.0 ** -24 * S + 2.0 ** -23 * S


def run_case(lib, d):
    m = json.loads((d / "meta.json").read_text())
    k, L, block, N, K = m["k"], m["l"], m["block"], m["rows"], m["cols"]
    rd = lambda n, t=np.float32: np.fromfile(d / n, t)
    words, scales, su, sv = rd("words.u32", np.uint32), rd("scales.f32"), rd("su.f32"), rd("sv.f32")
    x, normw = rd("x.f32"), rd("normw.f32")
    decoded, xh_ref, z_cpu, yt, y_cpu = (rd(n) for n in ("decoded.f32", "xh.f32", "z.f32", "yt.f32", "y.f32"))
    hr, hc = m["hb_rows"], m["hb_cols"]
    code = m.get("code", "1mad")
    cuda_codes = {"1mad": 0, "1mad8": 1, "1mad8h": 2, "1mad8s": 3, "gauss8s": 4, "gauss7s": 5}
    if code not in cuda_codes:
        sys.exit(f"trellis_code {code} has no CUDA path (the kernels take {', '.join(cuda_codes)})")
    ncode = cuda_codes[code]
    mad8 = ncode != 0  # int8 codes (1mad8's; the hashed codes': of the hashed index)
    # The fast paths (graph_trellis.rs, is_fast): 1mad's blocks of 32 at L 8 and of 64 at L 12;
    # the table paths, blocks of 32 and 64: 1mad8's at L 8, the hashed codes' at L 12.
    if mad8:
        fast = L == (8 if ncode == 1 else 12) and block in (32, 64)
    else:
        fast = (block, L) in ((32, 8), (64, 12))
    # The kernels' L argument carries the code above the state's bits (graph_trellis.rs, l_arg).
    Lk = L | ncode << 8
    nb = K // block
    keep, out = [], {}
    name = f"{d.name}: {code} k {k} L {L} block {block} ({N}, {K}){' coded' if m['coded'] else ''}"

    # L2: the decoded matrix.
    dec = np.zeros(N * K, np.float32)
    launch(lib, 0, (max(1, min((N * nb + THREADS - 1) // THREADS, RESIDENT)), 1), THREADS, [words, scales, dec, N, K, k, Lk, block], keep)
    out["decode L2"] = bits_equal(dec, decoded)

    # L2: the input transform.
    xb = to_bf16_bits(x)
    nwb = to_bf16_bits(normw)
    xh = np.zeros(K, np.float32)
    launch(lib, 1, (K // hc, 1), THREADS, [xb, nwb, sv, xh, K, hc, m["hscale_cols"], 0, 1e-5], keep)
    out["input L2"] = bits_equal(xh, xh_ref)

    # L3: the input transform with the norm, against float64 (bfloat16 rounding of the normed
    # inputs may differ where the float32 1/rms does: each such input moves by one bfloat16
    # ulp, 2^-8 relative, spread over its Hadamard block by 1/sqrt(hb)).
    xhn = np.zeros(K, np.float32)
    launch(lib, 1, (K // hc, 1), THREADS, [xb, nwb, sv, xhn, K, hc, m["hscale_cols"], 1, 1e-5], keep)
    x64 = x.astype(np.float64)
    inv = 1.0 / math.sqrt(float(np.mean(x64 * x64)) + 1e-5)
    xn = normw.astype(np.float64) * (x64 * inv) * sv
    h = np.array([[(-1) ** bin(i & j).count("1") for j in range(hc)] for i in range(hc)], np.float64) / math.sqrt(hc)
    ref_n = (xn.reshape(-1, hc) @ h).reshape(-1)
    bound_n = 2.0 ** -7 * float(np.max(np.abs(xn))) * math.sqrt(hc)
    out["input+norm L3"] = float(np.max(np.abs(xhn - ref_n))) <= bound_n

    # L3: the product, at several lanes a row.
    dec64 = decoded.astype(np.float64).reshape(N, K)
    z64 = dec64 @ xh_ref.astype(np.float64)
    S = np.abs(dec64) @ np.abs(xh_ref.astype(np.float64))
    g0 = lanes_per_row(N, K, block, fast)
    worst = 0.0
    ok = True
    z_host = None
    lprs = sorted({g0, 1, 4, 32})
    for g in lprs:
        z = np.zeros(N, np.float32)
        rows_per_block = (THREADS // 32) * (32 // g)
        grid = (max(1, min((N + rows_per_block - 1) // rows_per_block, RESIDENT)), 1)
        launch(lib, 2, grid, THREADS, [words, scales, xh_ref, z, N, K, k, Lk, block, g], keep)
        bound = np.array([matvec_bound(s, nb, block, K, g, fast) for s in S])
        err = np.abs(z.astype(np.float64) - z64)
        ok &= bool(np.all(err <= bound))
        worst = max(worst, float(np.max(err / bound)))
        if g == g0:
            z_host = z
    out[f"matvec L3 (lanes a row {lprs}, the host's {g0}; worst error / bound {worst:.3f})"] = ok

    # L2: the product on small integer inputs (-2..2), where every partial sum is an exact
    # integer below 2^24 (|code| <= 510, K <= 14,336), so any order of the sums gives the same
    # bits: z = float32(sum code * x) * float32(scale / divisor), the codes read back from the
    # decoded matrix (decode L2 above). This checks each weight's code exactly (1mad8's table,
    # 1mad8h's index).
    # The code's divisor (cpu::trellis TrellisCode::divisor: MAD_SCALE, MAD8_SCALE,
    # GAUSS8_SCALE, GAUSS7_SCALE).
    div = np.float32({0: 147.800537109375, 4: 41.91534423828125, 5: 43.402862548828125}.get(ncode, 36.805233001708984))
    codes = np.rint(decoded.astype(np.float64).reshape(N, K) / scales.astype(np.float64)[:, None]
                    * float(div)).astype(np.int64)
    xi = ((np.arange(K) * 7919 + 13) % 5 - 2).astype(np.float32)
    acc = codes @ xi.astype(np.int64)
    z_int = (acc.astype(np.float32) * (scales / div).astype(np.float32)).astype(np.float32)
    int_ok = bool(np.all(np.abs(acc) < 1 << 24))
    for g in sorted({g0, 1}):
        z = np.zeros(N, np.float32)
        rows_per_block = (THREADS // 32) * (32 // g)
        grid = (max(1, min((N + rows_per_block - 1) // rows_per_block, RESIDENT)), 1)
        launch(lib, 2, grid, THREADS, [words, scales, xi, z, N, K, k, Lk, block, g], keep)
        int_ok &= bits_equal(z, z_int)
    out["matvec on integer inputs L2"] = int_ok

    # L2: the input transform fused into the product's prologue (trellis_matvec_in) against
    # trellis_input then trellis_matvec, with and without the norm.
    same = True
    rows_per_block = (THREADS // 32) * (32 // g0)
    grid = (max(1, min((N + rows_per_block - 1) // rows_per_block, RESIDENT)), 1)
    for norm, xin in ((0, xh), (1, xhn)):
        z_two = np.zeros(N, np.float32)
        launch(lib, 2, grid, THREADS, [words, scales, xin, z_two, N, K, k, Lk, block, g0], keep)
        z_one = np.zeros(N, np.float32)
        launch(lib, 4, grid, THREADS, [words, scales, xb, nwb, sv, z_one, N, K, k, Lk, block, g0,
                                       hc, m["hscale_cols"], norm, 1e-5], keep)
        same &= bits_equal(z_one, z_two)
    out["matvec with the input fused L2"] = same

    # L2: the output transform on the CPU kernel's z.
    y = np.zeros(N, np.float32)
    launch(lib, 3, (N // hr, 1), THREADS, [z_cpu, su, None, None, y, N, hr, m["hscale_rows"], MODE_F32 | MODE_RAW], keep)
    yb = np.zeros(N, np.uint16)
    launch(lib, 3, (N // hr, 1), THREADS, [z_cpu, su, None, None, yb, N, hr, m["hscale_rows"], 0], keep)
    out["output L2"] = bits_equal(y, yt) and np.array_equal(yb, to_bf16_bits(rbf_np(yt)))

    # L2: the output transform fused into the product's epilogue (trellis_matvec_out: the last
    # block of each Hadamard block of rows) against trellis_matvec then trellis_output, float32
    # unrounded and bfloat16; its counts are back to zero after each launch.
    # The bfloat16 case adds into a residual in place (MODE_RES, out = res), as the decoder's
    # projections do: a Hadamard block transformed twice, or before its rows are all written
    # and again after, adds twice, so this catches what running the blocks in order hides.
    fused_ok = True
    res0 = to_bf16_bits(rbf_np(np.linspace(-1, 1, N, dtype=np.float32)))
    for mode, dt in ((MODE_F32 | MODE_RAW, np.float32), (MODE_RES, np.uint16)):
        zf = np.zeros(N, np.float32)
        counts = np.zeros(N // hr, np.int32)
        yf = res0.copy() if dt == np.uint16 else np.zeros(N, dt)
        launch(lib, 5, grid, THREADS, [words, scales, xh_ref, zf, counts, su, None, yf, yf, N, K, k, Lk,
                                       block, g0, hr, m["hscale_rows"], mode], keep)
        z2 = np.zeros(N, np.float32)
        launch(lib, 2, grid, THREADS, [words, scales, xh_ref, z2, N, K, k, Lk, block, g0], keep)
        y2 = res0.copy() if dt == np.uint16 else np.zeros(N, dt)
        launch(lib, 3, (N // hr, 1), THREADS, [z2, su, None, y2, y2, N, hr, m["hscale_rows"], mode], keep)
        fused_ok &= np.array_equal(yf.view(np.uint8), y2.view(np.uint8)) and not counts.any()
    out["matvec with the output fused L2"] = fused_ok

    # L3: the whole linear against TrellisView::matvec.
    ye = np.zeros(N, np.float32)
    launch(lib, 3, (N // hr, 1), THREADS, [z_host, su, None, None, ye, N, hr, m["hscale_rows"], MODE_F32 | MODE_RAW], keep)
    b_ours = np.array([matvec_bound(s, nb, block, K, g0, fast) for s in S])
    b_cpu = (K / 16 + 16 + 3) * 2.0 ** -24 * S + 2.0 ** -23 * S
    zn = float(np.linalg.norm(z64))
    bound_y = float(np.linalg.norm(b_ours + b_cpu)) + 2 * (math.log2(hr) + 2) * 2.0 ** -24 * math.sqrt(hr) * zn
    err_y = float(np.linalg.norm(ye.astype(np.float64) - y_cpu.astype(np.float64)))
    out[f"linear L3 (|dy| {err_y:.2e} <= {bound_y:.2e}; rel {err_y / max(float(np.linalg.norm(y_cpu)), 1e-30):.1e})"] = err_y <= bound_y
    return name, m.get("cpu_kernel"), out


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    ref = Path(sys.argv[1])
    only = set(sys.argv[2:])
    cases = sorted(p for p in ref.iterdir() if p.name.startswith("case_") and (not only or p.name in only))
    if not cases:
        names = ", ".join(sorted(only)) or "any case_*"
        print(f"no case in {ref} matches {names} (case names look like case_53)", file=sys.stderr)
        return 2
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(tmp)
        for d in cases:
            name, cpu, res = run_case(lib, d)
            bad = [k for k, v in res.items() if not v]
            failed += bool(bad)
            print(f"{'ok  ' if not bad else 'FAIL'} {name} (CPU kernel {cpu})")
            for k, v in res.items():
                print(f"       {'ok  ' if v else 'FAIL'} {k}")
    print(f"{len(cases) - failed} of {len(cases)} cases pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
