"""The order in which mlx-lm 0.32.2 writes a model's tensors, for every tiny fixture.

`save_model` writes `dict(tree_flatten(model.parameters()))` (through `make_shards`), and
`mx.save_safetensors` lays the tensors' data out in the iteration order of the
`std::unordered_map` that MLX's bindings fill from that dict, one emplace at a time in the
dict's order. So two writers give the same bytes exactly when they insert the same names in the
same order: the order of `tree_flatten(model.parameters())`, i.e. of each module class's
`__init__`. This script loads every fixture under mlx-models/tests/models, mlx-cli/tests/models
and mlx-cli/tests/convert with mlx-lm's own `load_model` (lazy: only names are needed) and
records that order, as a permutation of the sorted names (compact), in
mlx-cli/tests/goldens/param_order.json, and, per model type, each module's children in the
order its class defines them (merged over that type's fixtures) in
mlx-models/src/param_order.json, the table `convert` orders a model's parameters by. `cargo test -p mlx-cli --test integration
convert::every_fixture_` checks that `convert_in_memory` (what every writer saves: convert, GPTQ, AWQ,
dynamic, DWQ) lists the parameters in that order.

Run with `cargo xtask goldens param_order`.
"""

import hashlib
import json
import sys
from pathlib import Path

from mlx.utils import tree_flatten
from mlx_lm.utils import load_model

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "mlx-cli" / "tests" / "goldens" / "param_order.json"
TABLE = ROOT / "mlx-models" / "src" / "param_order.json"
DIRS = [
    ROOT / "mlx-models" / "tests" / "models",
    ROOT / "mlx-cli" / "tests" / "models",
    ROOT / "mlx-cli" / "tests" / "convert",
]


def fixtures():
    for base in DIRS:
        for cfg in sorted(base.rglob("config.json")):
            d = cfg.parent
            if d.is_symlink() or any(p.is_symlink() for p in d.relative_to(ROOT).parents if p != Path(".")):
                continue
            if not list(d.glob("model*.safetensors")):
                continue
            yield d


def pattern(parts):
    return ".".join("*" if p.isdigit() else p for p in parts)


def add_order(graph, names):
    """Each concrete parent's children in first-seen order give precedence pairs for the
    merge, under the parent's pattern (list indices as `*`) and under the pattern with the
    parent's set of children (`model.layers.*|mlp,self_attn`), kept for the types whose list
    items are of several classes that order their children differently."""
    seen = {}
    for n in names:
        parts = n.split(".")
        for i, c in enumerate(parts):
            if c.isdigit():
                continue
            kids = seen.setdefault(".".join(parts[:i]), [])
            if c not in kids:
                kids.append(c)
    for parent, kids in seen.items():
        pat = pattern(parent.split("."))
        for key in (pat, "=" + pat + "|" + ",".join(sorted(kids))):
            g = graph.setdefault(key, {"first": [], "after": {}})
            for k in kids:
                if k not in g["first"]:
                    g["first"].append(k)
            for a, b in zip(kids, kids[1:]):
                g["after"].setdefault(b, set()).add(a)


def topo(g):
    left, done = list(g["first"]), []
    while left:
        ready = [k for k in left if not (g["after"].get(k, set()) - set(done))]
        if not ready:
            return None
        done.append(ready[0])
        left.remove(ready[0])
    return done


def merge(graph, model_type):
    """Topological order of each parent's children (ties in first-seen order). Where the
    fixtures order a pattern's children both ways (list items of several classes), the
    pattern's orders per set of children (`model.layers.*|a,b,c`) are kept instead, which the
    lookup tries first."""
    out = {}
    conflicts = []
    for pat, g in sorted(graph.items()):
        if pat.startswith("="):
            continue
        order = topo(g)
        if order is None:
            conflicts.append(pat)
            continue
        out[pat] = order
    for pat in conflicts:
        print(f"{model_type}: {pat}: children ordered both ways; kept per set of children", file=sys.stderr)
        for key, g in sorted(graph.items()):
            if key.startswith("=" + pat + "|"):
                order = topo(g)
                if order is None:  # fixtures of one type whose configs pick other classes
                    print(f"{model_type}: {key}: still both ways; the first fixture's order kept", file=sys.stderr)
                    order = g["first"]
                out[key[1:]] = order
    return out


def main():
    cases = {}
    skipped = {}
    graphs = {}
    for d in fixtures():
        rel = str(d.relative_to(ROOT))
        try:
            model, _ = load_model(d, lazy=True)
        except BaseException as e:  # a fixture mlx-lm does not load as it is (padded, staged)
            skipped[rel] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            continue
        names = [k for k, _ in tree_flatten(model.parameters())]
        model_type = json.loads((d / "config.json").read_text()).get("model_type", "")
        add_order(graphs.setdefault(model_type, {}), names)
        ranked = sorted(names)
        pos = {n: i for i, n in enumerate(ranked)}
        cases[rel] = {
            "names_sha": hashlib.sha256("\n".join(ranked).encode()).hexdigest()[:16],
            "order": [pos[n] for n in names],
        }
        print(rel, len(names), file=sys.stderr)
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(k) + ": " + json.dumps(v, separators=(",", ":")) for k, v in sorted(cases.items())]
    text = '{"cases": {\n' + ",\n".join(lines) + '\n},\n"skipped": ' + json.dumps(skipped, indent=1, sort_keys=True) + "}\n"
    GOLDEN.write_text(text)
    table = {t: merge(g, t) for t, g in sorted(graphs.items())}
    lines = [json.dumps(t) + ": " + json.dumps(v, separators=(",", ":")) for t, v in table.items()]
    TABLE.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"{len(cases)} fixtures, {len(skipped)} skipped")


if __name__ == "__main__":
    main()
