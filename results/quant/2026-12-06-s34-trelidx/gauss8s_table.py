#!/usr/bin/env python3
"""The `gauss8s` trellis code's 256 int8 codes and divisor (mlx-core/src/cpu/trellis.rs GAUSS8_TABLE,
GAUSS8_SCALE), from their definition:
entry i (i = 0..255) takes the Gaussian quantile of position p(i) = 16 * class(i) + rank(i) of 256:
q(i) = Phi^-1((p(i) + 0.5) / 256), where, with r = i % 16, class(i) = 4 (r % 4) + 2 ((r / 4) % 2) + r / 8
(so any 4 consecutive entries mod 256 hold one quantile of each quarter of the distribution, any 8
one of each eighth, any 16 one of each sixteenth) and rank(i) = the rank of entry i's 1MAD byte sum
among the 16 entries j = i (mod 16) (ties: the smaller j first). The int8 code is
round(127 q(i) / q_max) (half away from zero), q_max = Phi^-1(255.5 / 256); the divisor is
127 / (1.05 q_max) (values 1.05 times the quantiles: the Gaussian MSE screen's best scale at 3 bits)."""
from statistics import NormalDist
import math

A, B = 34038481, 76625530

def mad_sum(s):
    x = (s * A + B) & 0xFFFFFFFF
    return sum((x >> (8 * j)) & 0xFF for j in range(4))

def table():
    nd = NormalDist()
    qmax = nd.inv_cdf(255.5 / 256)
    out = []
    for i in range(256):
        r = i % 16
        cls = 4 * (r % 4) + 2 * ((r // 4) % 2) + r // 8
        peers = sorted((j for j in range(256) if j % 16 == r), key=lambda j: (mad_sum(j), j))
        rank = peers.index(i)
        q = nd.inv_cdf((16 * cls + rank + 0.5) / 256)
        v = 127 * q / qmax
        out.append(int(math.copysign(math.floor(abs(v) + 0.5), v)))
    return out, 127 / (1.05 * qmax)

if __name__ == "__main__":
    t, d = table()
    assert sorted(t) == sorted(t) and len(set(t)) > 100
    print(f"divisor {d!r} (f32 literal {d:.9})")
    for i in range(0, 256, 16):
        print("    " + ", ".join(str(v) for v in t[i:i + 16]) + ",")
