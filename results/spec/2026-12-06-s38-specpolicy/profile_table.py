#!/usr/bin/env python3
"""Tables from profile_ab.sh logs: per run, the decoder's ms a step (plain) or a pass (lookup),
its own generation_tps and CPU seconds; per round (a plain run and the lookup run beside it),
the modelled ratio 75 x step / (27 x pass) (74 tokens and the EOS: 75 plain steps, 27 passes),
the extra-row cost c = (pass / step - 1) / (rows a pass - 1), and each part's cost per extra
row in ms and as a share of its one-row cost. usage: profile_table.py LOG [LOG ...]"""
import re, sys

PARTS = ["qkv", "o_proj", "gate_up", "down", "lm_head", "attention", "elementwise", "outside", "embed"]


def runs(path):
    out = []
    for b in re.split(r"(?m)^== ", open(path).read())[1:]:
        head = b.splitlines()[0]
        kind = head.split()[0]
        if kind == "one-token":
            m = re.search(r"cpu user ([\d.]+) sys ([\d.]+)", b)
            out.append(dict(kind=kind, cpu=float(m.group(1)) + float(m.group(2)) if m else None))
            continue
        step = float(re.search(r"([\d.]+) ms a step in all", b).group(1))
        rows = float(re.search(r"([\d.]+) rows a step", b).group(1))
        n = int(re.search(r"profile: (\d+) decode steps", b).group(1))
        parts = {k: float(v) for k, v in re.findall(r"cpu-profile (\w+)\s+([\d.]+) ms/step", b)}
        m = re.search(r"cpu user ([\d.]+) sys ([\d.]+)", b)
        tps = float(re.search(r"generation_tps ([\d.]+)", b).group(1))
        load = head.split("load average:")[1].strip() if "load average:" in head else "?"
        t = re.search(r"(\d\d:\d\d:\d\d)", head).group(1)
        out.append(dict(kind=kind, step=step, rows=rows, n=n, parts=parts, tps=tps, load=load,
                        time=t, cpu=float(m.group(1)) + float(m.group(2)) if m else None))
    return out


def pairs(path):
    """The rounds' (plain, lookup) run pairs of one log, in order (a one-token run starts a
    round afresh)."""
    out, pend = [], {}
    for r in runs(path):
        if r["kind"] == "one-token":
            pend = {}
            continue
        pend[r["kind"]] = r
        if "plain" in pend and "lookup" in pend:
            out.append((pend["plain"], pend["lookup"]))
            pend = {}
    return out


def main():
    for path in sys.argv[1:]:
        rs = runs(path)
        print(f"\n{path}\n")
        print("| time (UTC) | load (1, 5, 15 min) | plain ms/step | lookup ms/pass | rows/pass | "
              "modelled ratio | c | tps plain / lookup | tps ratio | decode CPU s plain / lookup |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        one, pend, pairs = None, {}, []
        for r in rs:
            if r["kind"] == "one-token":
                one, pend = r["cpu"], {}
                continue
            r["dcpu"] = None if (one is None or r["cpu"] is None) else r["cpu"] - one
            pend[r["kind"]] = r
            if "plain" in pend and "lookup" in pend:
                p, s = pend["plain"], pend["lookup"]
                c = (s["step"] / p["step"] - 1) / (s["rows"] - 1)
                ratio = p["n"] * p["step"] / (s["n"] * s["step"])
                dc = (f"{p['dcpu']:.2f} / {s['dcpu']:.2f}" if p["dcpu"] is not None
                      and s["dcpu"] is not None else "?")
                print(f"| {p['time']} | {p['load']} | {p['step']:.2f} | {s['step']:.2f} | "
                      f"{s['rows']:.2f} | {ratio:.2f}x | {c:.2f} | {p['tps']:.1f} / {s['tps']:.1f} | "
                      f"{s['tps'] / p['tps']:.2f}x | {dc} |")
                pairs.append((p, s))
                pend = {}
        for p, s in pairs:
            x = s["rows"] - 1
            print(f"\nper extra verify row, {p['time']} (load {p['load']}): ms (share of the part's "
                  f"one-row cost; contribution to c)\n")
            print("| part | one-row step ms | pass ms | extra row ms | share | c part |")
            print("|---|---|---|---|---|---|")
            tot = 0.0
            for k in PARTS:
                a, b = p["parts"].get(k, 0.0), s["parts"].get(k, 0.0)
                e = (b - a) / x
                tot += e
                sh = f"{e / a:.2f}" if a > 0 else "-"
                print(f"| {k} | {a:.3f} | {b:.3f} | {e:.3f} | {sh} | {e / p['step']:.3f} |")
            print(f"| all | {p['step']:.3f} | {s['step']:.3f} | {tot:.3f} | | {tot / p['step']:.3f} |")


if __name__ == "__main__":
    main()
