"""The lane layout proposed for tensor-core batched 4-bit matrix-vector tiles (issue #30's next
step), checked in numpy: one warp computes 16 weight rows x up to 8 sequences with
mma.sync.m16n8k16 (bfloat16 inputs, float32 accumulators), the codes read straight from MLX's
affine 4-bit layout (uint32 words, the lowest bits first, group size 64), no copy or
re-layout of the weights.

The instruction's fragments (PTX ISA, mma.m16n8k16, .bf16): lane = 4 g + t (g = groupID,
t = thread in group). A (16 x 16): a0 a1 = A[g][2t, 2t+1], a2 a3 = A[g+8][2t, 2t+1],
a4 a5 = A[g][2t+8, 2t+9], a6 a7 = A[g+8][2t+8, 2t+9]. B (16 x 8): b0 b1 = B[2t, 2t+1][g],
b2 b3 = B[2t+8, 2t+9][g]. C/D (16 x 8): c0 c1 = C[g][2t, 2t+1], c2 c3 = C[g+8][2t, 2t+1].

A logical k may stand for any physical input index as long as A and B agree, so lane (g, t)
takes the 16 codes (8 bytes) of rows g and g + 8 at inputs [64 j + 16 t, 64 j + 16 t + 16)
of group j, and its B values from sequence g at the same inputs: the four lanes of a quad
cover one group (one scale and bias a row), and each 32-byte sector of a row is read whole.
Mma step s (0..3) of group j uses, of lane t's 16 codes, codes 4 s .. 4 s + 3 as logical
k = 2t, 2t+1, 2t+8, 2t+9. After the group's four steps (accumulator from zero), lane (g, t)
folds acc[row][seq] += scale[row][j] * D + bias[row][j] * xsum[seq][j] for its rows g, g + 8
and sequences 2t, 2t + 1. Codes become bfloat16 exactly as (0x4300 | q) - 128 (bfloat16 128 + q,
one packed bfloat16 subtract for two codes). Sequences past the batch are zero columns of B:
the columns are independent, so one row decoded alone through the same tile gives the same
bits as in a batch (batched == single stays bit-equal when single-row decode uses the tiles).
    python3 mma_layout.py     # checks the layout on random data against a float64 reference
"""
import numpy as np

rng = np.random.default_rng(0)
ROWS, K, GS, NB = 16, 256, 64, 8
codes = rng.integers(0, 16, size=(ROWS, K))
scales = rng.normal(size=(ROWS, K // GS)) * 0.01
biases = rng.normal(size=(ROWS, K // GS)) * 0.01
x = rng.normal(size=(NB, K))
# MLX's packing: word w of a row holds codes 8 w .. 8 w + 7, code i at bits 4 (i % 8).
words = np.zeros((ROWS, K // 8), dtype=np.uint64)
for i in range(8):
    words |= codes[:, i::8].astype(np.uint64) << np.uint64(4 * i)


def lane_codes(row, j, t):
    """The 16 codes lane t reads of `row` for group j: two words (8 bytes)."""
    w0 = (64 * j + 16 * t) // 8
    out = []
    for w in (words[row, w0], words[row, w0 + 1]):
        out += [int(w >> np.uint64(4 * i)) & 15 for i in range(8)]
    return out


def mma(a, b, c):
    """D = A B + C over the fragments of all 32 lanes (by definition, in float64)."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for lane in range(32):
        g, t = divmod(lane, 4)
        a0, a1, a2, a3, a4, a5, a6, a7 = a[lane]
        A[g, 2 * t], A[g, 2 * t + 1], A[g + 8, 2 * t], A[g + 8, 2 * t + 1] = a0, a1, a2, a3
        A[g, 2 * t + 8], A[g, 2 * t + 9], A[g + 8, 2 * t + 8], A[g + 8, 2 * t + 9] = a4, a5, a6, a7
        b0, b1, b2, b3 = b[lane]
        B[2 * t, g], B[2 * t + 1, g], B[2 * t + 8, g], B[2 * t + 9, g] = b0, b1, b2, b3
    D = A @ B
    out = []
    for lane in range(32):
        g, t = divmod(lane, 4)
        out.append([D[g, 2 * t] + c[lane][0], D[g, 2 * t + 1] + c[lane][1],
                    D[g + 8, 2 * t] + c[lane][2], D[g + 8, 2 * t + 1] + c[lane][3]])
    return out


acc = [[0.0] * 4 for _ in range(32)]
for j in range(K // GS):
    d = [[0.0] * 4 for _ in range(32)]
    for s in range(4):
        a, b = [], []
        for lane in range(32):
            g, t = divmod(lane, 4)
            lo, hi = lane_codes(g, j, t), lane_codes(g + 8, j, t)
            q = [4 * s, 4 * s + 1, 4 * s + 2, 4 * s + 3]  # -> logical k 2t, 2t+1, 2t+8, 2t+9
            a.append([lo[q[0]], lo[q[1]], hi[q[0]], hi[q[1]], lo[q[2]], lo[q[3]], hi[q[2]], hi[q[3]]])
            base = 64 * j + 16 * t
            b.append([x[g, base + q[0]], x[g, base + q[1]], x[g, base + q[2]], x[g, base + q[3]]])
        d = mma(a, b, d)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for e, (row, seq) in enumerate([(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]):
            xsum = x[seq, 64 * j:64 * j + 64].sum()
            acc[lane][e] += scales[row, j] * d[lane][e] + biases[row, j] * xsum

W = np.repeat(scales, GS, axis=1) * codes + np.repeat(biases, GS, axis=1)
want = W @ x.T  # [ROWS, NB]
worst = 0.0
for lane in range(32):
    g, t = divmod(lane, 4)
    for e, (row, seq) in enumerate([(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]):
        worst = max(worst, abs(acc[lane][e] - want[row, seq]))
print(f"16 rows x {NB} sequences, K = {K}: largest difference to W x {worst:.2e}")
assert worst < 1e-9, "layout mismatch"
# The code -> bfloat16 conversion: bits 0x4300 | q read as bfloat16 are 128 + q, exactly.
bf = ((np.arange(16, dtype=np.uint32) | 0x4300) << 16).view(np.float32)
assert (bf - 128 == np.arange(16)).all()
print("layout ok; (0x4300 | q) as bfloat16 = 128 + q for every 4-bit code")
