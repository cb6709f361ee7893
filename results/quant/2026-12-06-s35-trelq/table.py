"""s35 trelq: the perplexities of this folder (ppl*_NAME.json; the JSON line of each) against
affine-4 (17.227 at 4,096 tokens, 18.591 at 16,384: this folder's ppl_smol-a4.json, ppl32_smol-a4.json).
Swap rows: the share of g7-s0's gap to m12-s0 that taking the named linears from m12-s0 recovers,
and those linears' share of the decoder's linear weights (SmolLM2-135M: q, o 576x576; k, v 192x576;
gate, up 1536x576; down 576x1536; 30 layers)."""
import glob
import json
import os

A4 = {8: 17.226714340191652, 32: 18.590884695190766}


def ppl(name, ns=8):
    f = f"ppl_{name}.json" if ns == 8 else f"ppl{ns}_{name}.json"
    if not os.path.exists(f):
        return None
    for line in open(f):
        if line.startswith("{"):
            return json.loads(line)["perplexity"]


SIZE = {"q": 576 * 576, "k": 192 * 576, "v": 192 * 576, "o": 576 * 576, "gate": 1536 * 576, "up": 1536 * 576, "down": 1536 * 576}
TOT = 30 * sum(SIZE.values())


def share(sel):
    n = 0
    for term in sel.split(","):
        ls, ks = term.split(":")
        layers = 30 if ls == "*" else int(ls.split("-")[-1]) - int(ls.split("-")[0]) + 1
        kinds = list(SIZE) if ks == "*" else ks.split("+")
        n += layers * sum(SIZE[k] for k in kinds)
    return n / TOT


SW = [("sw-late", "15-29:*"), ("sw-early", "0-14:*"), ("sw-attn", "*:q+k+v+o"), ("sw-lateattn", "15-29:q+k+v+o"),
      ("sw-25-29", "25-29:*"), ("sw-v", "*:v"), ("sw-l29qkv", "29:q+k+v")]
g, m = ppl("g7-s0"), ppl("m12-s0")
print("| model (seed 0, 4,096 tokens) | 1mad at | share of weights | perplexity | vs affine-4 | gap to m12-s0 recovered |")
print("|---|---|---|---|---|---|")
print(f"| g7-s0 (gauss7s everywhere) | none | 0% | {g:.3f} | {100 * (g / A4[8] - 1):+.1f}% | 0% |")
for n, sel in SW:
    p = ppl(n)
    if p:
        print(f"| {n} | `{sel}` | {100 * share(sel):.1f}% | {p:.3f} | {100 * (p / A4[8] - 1):+.1f}% | {100 * (g - p) / (g - m):.0f}% |")
print(f"| m12-s0 (1mad everywhere) | all | 100% | {m:.3f} | {100 * (m / A4[8] - 1):+.1f}% | 100% |")
print()
print("| hybrid hv-sN: gauss7s L 12, 1mad L 12 at every v_proj | 4,096 tokens | vs affine-4 | 16,384 tokens | vs affine-4 |")
print("|---|---|---|---|---|")
rows = {8: [], 32: []}
for s in range(3):
    n = "sw-v" if s == 0 else f"hv-s{s}"
    p8, p32 = ppl(n), ppl(n, 32)
    c = [f"{p:.3f} | {100 * (p / A4[k] - 1):+.1f}%" if p else " | " for p, k in ((p8, 8), (p32, 32))]
    for p, k in ((p8, 8), (p32, 32)):
        if p:
            rows[k].append(p / A4[k] - 1)
    print(f"| seed {s} ({n}) | {c[0]} | {c[1]} |")
for k, r in rows.items():
    if r:
        print(f"\n{4096 if k == 8 else 16384} tokens, {len(r)} seeds: mean {100 * sum(r) / len(r):+.1f}%, worst {100 * max(r):+.1f}%")
