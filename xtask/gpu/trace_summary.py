"""Summarises a graph decoder timeline (`bench_generate --decoder graph --graph-trace PATH`).

    python3 xtask/gpu/trace_summary.py [--blocks LAYER] TRACE [TRACE ...]   (TRACE.xz as well)

Each line of a trace is one block of one kernel: `what block_x block_y sm entry waited
prologue end [first_data]` (mlx_kernels::graph_decode::TraceRecord; times in ns). The kernels of the step
are told apart by `what` (consecutive kernels always differ; attention's combining blocks
count as attention). For each kernel the step's
critical path is split at the previous kernel's last block end:
- `release`: from the previous kernel's end to this kernel's first block past its wait (the
  launch and the dependency's flush; negative where its blocks waited before the previous
  kernel ended, which they cannot);
- `prologue`: from its first block past the wait to its last block past its prologue;
- `stream`: from there to its last block's end (weights streamed, then the tail);
and `first_end` is its first block's end (its tail is `end - first_end`). Medians over the
layers by kind, the sums over the step, and the step's span are printed. `--blocks LAYER`
adds, for each kernel of that layer, the spread over its blocks (min / median / max, us from
the kernel's first block past the wait) of entry, wait and end, of each block's own prologue
and stream durations, and (traces with first_data) of how long after its prologue a
block's first weights, loaded before the wait, were still missing (`late`).
"""
import lzma
import statistics
import sys


def kind(what):
    k, mode, K = what & 0xFF, (what >> 8) & 0xFF, what >> 16
    if k == 1:
        return "qkv"
    if k == 2:
        return "attention"
    if mode & 32:  # matvec_attn_out: the output projection combining attention's partials
        return f"o_combine_k{K}"
    if mode & 8:
        return "head"
    if mode & 4:
        return "gate_up"
    return f"res_k{K}"


def instances(path):
    recs = []
    opener = lzma.open if str(path).endswith(".xz") else open
    for line in opener(path, "rt"):
        f = [int(x) for x in line.split()]
        if len(f) in (8, 9):
            recs.append(f + [0] * (9 - len(f)))
    recs.sort(key=lambda r: r[4])
    out, cur = [], None
    for r in recs:
        # Attention's combining blocks carry a flag in the mode bits: the same kernel.
        what = r[0] & ~0xFF00 if r[0] & 0xFF == 2 else r[0]
        if cur is None or what != cur["what"]:
            cur = {"what": what, "recs": []}
            out.append(cur)
        cur["recs"].append(r)
    return out


def summarise(path):
    ins = instances(path)
    t0 = min(r[4] for i in ins for r in i["recs"])
    rows = []
    prev_end = None
    for i in ins:
        rs = i["recs"]
        entry = min(r[4] for r in rs)
        waited = min(r[5] for r in rs)
        pro = max(r[6] for r in rs)
        end = max(r[7] for r in rs)
        first_end = min(r[7] for r in rs)
        base = prev_end if prev_end is not None else entry
        rows.append({
            "kind": kind(i["what"]),
            "blocks": len(rs),
            "release": waited - base,
            "prologue": pro - waited,
            "stream": end - pro,
            "tail": end - first_end,
            "total": end - base,
            "entry_lead": base - entry,
        })
        prev_end = end
    span = prev_end - t0
    print(f"{path}: {len(ins)} kernels, span {span / 1e3:.1f} us")
    kinds = []
    for r in rows:
        if r["kind"] not in kinds:
            kinds.append(r["kind"])
    cols = ["release", "prologue", "stream", "tail", "total", "entry_lead"]
    print(f"{'kind':>10} {'n':>3} {'blocks':>6} " + " ".join(f"{c:>10}" for c in cols) + "   (median us)")
    sums = {c: 0.0 for c in cols}
    for k in kinds:
        rk = [r for r in rows if r["kind"] == k]
        med = {c: statistics.median(r[c] for r in rk) / 1e3 for c in cols}
        for c in cols:
            sums[c] += sum(r[c] for r in rk) / 1e3
        print(f"{k:>10} {len(rk):>3} {rk[0]['blocks']:>6} " + " ".join(f"{med[c]:>10.2f}" for c in cols))
    print(f"{'sum':>10} {len(rows):>3} {'':>6} " + " ".join(f"{sums[c]:>10.1f}" for c in cols) + "   (us over the step)")


def blocks(path, layer):
    ins = instances(path)
    first = next(i for i, x in enumerate(ins) if kind(x["what"]) == "qkv")
    print(f"{path}: layer {layer}, per block (min / median / max us)")
    for x in ins[first + 5 * layer:first + 5 * layer + 5]:
        rs = x["recs"]
        base = min(r[5] for r in rs)

        def spread(v):
            v = sorted(v)
            return "/".join(f"{t / 1e3:.2f}" for t in (v[0], v[len(v) // 2], v[-1]))

        print(f"{kind(x['what']):>10} {len(rs):>4}  entry {spread([r[4] - base for r in rs])}"
              f"  wait {spread([r[5] - base for r in rs])}"
              f"  prologue {spread([r[6] - r[5] for r in rs])}"
              f"  stream {spread([r[7] - r[6] for r in rs])}"
              f"  end {spread([r[7] - base for r in rs])}"
              + (f"  late {spread([r[8] - r[6] for r in rs])}" if all(r[8] for r in rs) else ""))


def main():
    args = sys.argv[1:]
    layer = None
    if args[:1] == ["--blocks"]:
        layer, args = int(args[1]), args[2:]
    for p in args:
        summarise(p)
        if layer is not None:
            blocks(p, layer)


if __name__ == "__main__":
    main()
