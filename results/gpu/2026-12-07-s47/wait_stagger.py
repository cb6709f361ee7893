"""When a kernel's blocks pass their wait, against the first of them (#30, session 47).

    python3 wait_stagger.py TRACE[.xz] [KIND ...]   (default kinds: qkv gate_up)

For each kernel of the named kinds (trace_summary.py's kinds), each block's wait end less the
kernel's first; then the median of that by SM and by block index (lowest and highest six) and
a histogram over every block (half-microsecond bins)."""
import collections
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "xtask" / "gpu"))
from trace_summary import instances, kind  # noqa: E402


def main():
    path, kinds = sys.argv[1], sys.argv[2:] or ["qkv", "gate_up"]
    by_sm, by_block, every = collections.defaultdict(list), collections.defaultdict(list), []
    for ins in instances(path):
        if kind(ins["what"]) not in kinds:
            continue
        rs = ins["recs"]
        w0 = min(r[5] for r in rs)
        for r in rs:
            late = (r[5] - w0) / 1e3
            by_sm[r[3]].append(late)
            by_block[r[1]].append(late)
            every.append(late)
    for name, d in (("SM", by_sm), ("block", by_block)):
        m = sorted((statistics.median(v), k) for k, v in d.items())
        fmt = lambda xs: ", ".join(f"{k} {v:.2f}" for v, k in xs)
        print(f"{name}: median us late, lowest: {fmt(m[:6])}; highest: {fmt(m[-6:])}")
    h = collections.Counter(round(x * 2) / 2 for x in every)
    print("histogram (us late: blocks):", ", ".join(f"{k}: {v}" for k, v in sorted(h.items())))


if __name__ == "__main__":
    main()
