#!/usr/bin/env python3
"""The stratified Gaussian tables of the `gauss8s` and `gauss7s` trellis codes
(mlx-core/src/cpu/trellis.rs GAUSS8_TABLE / GAUSS8_SCALE, GAUSS7_TABLE / GAUSS7_SCALE), from their
definition, for n = 256 (gauss8s) or 128 (gauss7s) entries:
entry i (i = 0..n-1) takes the Gaussian quantile of position p(i) = (n / 16) class(i) + rank(i) of n:
q(i) = Phi^-1((p(i) + 0.5) / n), where, with r = i % 16, class(i) = 4 (r % 4) + 2 ((r / 4) % 2) + r / 8
(so any 4 consecutive entries mod n hold one quantile of each quarter of the distribution, any 8
one of each eighth, any 16 one of each sixteenth) and rank(i) = the rank of entry i's 1MAD byte sum
among the n / 16 entries j = i (mod 16) (ties: the smaller j first). The int8 code is
round(127 q(i) / q_max) (half away from zero), q_max = Phi^-1((n - 0.5) / n); the divisor is
127 / (m q_max): the values are m times the quantiles (m = 1.05 for gauss8s, 1.1 for gauss7s: the
Gaussian MSE screen's best scale at 3 bits).
usage: gauss8s_table.py [256|128]"""
from statistics import NormalDist
import math
import sys

A, B = 34038481, 76625530

def mad_sum(s):
    x = (s * A + B) & 0xFFFFFFFF
    return sum((x >> (8 * j)) & 0xFF for j in range(4))

def table(n=256):
    m = {256: 1.05, 128: 1.1}[n]
    nd = NormalDist()
    qmax = nd.inv_cdf((n - 0.5) / n)
    out = []
    for i in range(n):
        r = i % 16
        cls = 4 * (r % 4) + 2 * ((r // 4) % 2) + r // 8
        peers = sorted((j for j in range(n) if j % 16 == r), key=lambda j: (mad_sum(j), j))
        rank = peers.index(i)
        q = nd.inv_cdf(((n // 16) * cls + rank + 0.5) / n)
        v = 127 * q / qmax
        out.append(int(math.copysign(math.floor(abs(v) + 0.5), v)))
    return out, 127 / (m * qmax)

if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    t, d = table(n)
    print(f"divisor {d!r} (f32 literal {d:.9})")
    for i in range(0, n, 16):
        print("    " + ", ".join(str(v) for v in t[i:i + 16]) + ",")
