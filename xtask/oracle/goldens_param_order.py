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

import copy
import dataclasses
import hashlib
import importlib
import json
import random
import sys
import types
from pathlib import Path

# mlx-lm's olmo module only probes that `hf_olmo` imports; its classes need nothing from it.
sys.modules.setdefault("hf_olmo", types.ModuleType("hf_olmo"))

import mlx.nn as nn  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from mlx_lm.utils import MODEL_ARCHITECTURE_REMAPPING, MODEL_REMAPPING, load_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "mlx-cli" / "tests" / "goldens" / "param_order.json"
HELDOUT = ROOT / "mlx-cli" / "tests" / "goldens" / "param_order_heldout.json"
TABLE = ROOT / "mlx-models" / "src" / "param_order.json"
PREDICATES = ROOT / "mlx-models" / "src" / "predicates.json"
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


def module_of(cfg):
    """The mlx-lm module `_get_classes` picks for a config (architecture, then model-type remapping)."""
    model_type = cfg.get("model_type", "")
    archs = cfg.get("architectures") or ()
    if isinstance(archs, str):
        archs = (archs,)
    for a in archs:
        r = MODEL_ARCHITECTURE_REMAPPING.get((model_type, a))
        if r is not None:
            return r
    return MODEL_REMAPPING.get(model_type, model_type)


def build(module, cfg):
    """mlx-lm's own `Model(ModelArgs.from_dict(config))`, as `load_model` builds it (lazy: nothing
    is evaluated); its `tree_flatten(model.parameters())` is the loaded model's order."""
    arch = importlib.import_module(f"mlx_lm.models.{module}")
    return arch.Model(arch.ModelArgs.from_dict(copy.deepcopy(cfg)))


def names_of(model):
    return [k for k, _ in tree_flatten(model.parameters())]


def switches(module, cfg):
    """Every boolean switch of a config: (where, key, flipped value). The booleans it sets (top
    level and in its `text_config`) and the boolean fields of mlx-lm's argument classes it
    leaves at their defaults (the model's own `ModelArgs`, and those of its inner modules, a
    wrapper's text model's, set in `text_config`)."""
    arch = importlib.import_module(f"mlx_lm.models.{module}")
    out = [(None, k, not v) for k, v in cfg.items() if isinstance(v, bool)]
    out += [(None, f.name, not f.default) for f in dataclasses.fields(arch.ModelArgs)
            if f.name not in cfg and isinstance(f.default, bool)]
    tc = cfg.get("text_config")
    if isinstance(tc, dict):
        out += [("text_config", k, not v) for k, v in tc.items() if isinstance(v, bool)]
        try:
            model = build(module, cfg)
        except BaseException:
            return out
        inner = []
        for _, m in model.named_modules():
            a = getattr(m, "args", None) or getattr(m, "config", None)
            if dataclasses.is_dataclass(a) and not isinstance(a, arch.ModelArgs) and type(a) not in inner:
                inner.append(type(a))
        for cls in inner:
            out += [("text_config", f.name, not f.default) for f in dataclasses.fields(cls)
                    if f.name not in tc and isinstance(f.default, bool)]
    return out


def with_switches(cfg, sw):
    c = copy.deepcopy(cfg)
    for where, k, v in sw:
        (c if where is None else c[where])[k] = v
    return c


def quantized(model):
    """`nn.quantize` at 4 bits, group 32, of every module that can be (a quantized model's
    `scales` and `biases` beside each `weight`)."""
    def pred(_, m):
        w = getattr(m, "weight", None)
        return hasattr(m, "to_quantized") and w is not None and w.shape[-1] % 32 == 0
    nn.quantize(model, group_size=32, bits=4, class_predicate=pred)
    return model


def distinct_items(names):
    """The names of a list's items whose sets of names differ (the first of each kind: a
    dense layer, a mixture-of-experts layer, a linear-attention one), so the golden stays small
    while keeping every kind of item; the rest are the same names under another index."""
    def item(n):
        p = n.split(".")
        i = next((j for j, x in enumerate(p) if x.isdigit()), None)
        if i is None:
            return None
        return (".".join(p[:i]), p[i]), ".".join(p[i + 1:])
    items = {}
    for n in names:
        it = item(n)
        if it is not None:
            items.setdefault(it[0], set()).add(it[1])
    keep, kinds = set(), {}
    for key, rest in items.items():
        if frozenset(rest) not in kinds.setdefault(key[0], set()):
            kinds[key[0]].add(frozenset(rest))
            keep.add(key)
    return [n for n in names if item(n) is None or item(n)[0] in keep]


def delta(names):
    """Each name as `K:rest`: K leading components shared with the previous name, then the rest."""
    out, prev = [], []
    for n in names:
        p = n.split(".")
        k = 0
        while k < min(len(p), len(prev)) and p[k] == prev[k]:
            k += 1
        out.append(f"{k}:{'.'.join(p[k:])}")
        prev = p
    return out


def first_star(name):
    """A name with its first list index (the layer's) as `*`; later indices (a Sequential's
    items) stay, predicates read them (`lora.2`)."""
    parts = name.split(".")
    i = next((j for j, x in enumerate(parts) if x.isdigit()), None)
    if i is not None:
        parts[i] = "*"
    return ".".join(parts)


def siblings(names):
    """Each concrete parent's named (non-index) children among the parameter names, sorted and
    joined with commas: `convert.rs`'s key for a pattern whose answers differ by layer kind."""
    kids = {}
    for n in names:
        parts = n.split(".")
        for i, c in enumerate(parts):
            if not c.isdigit():
                kids.setdefault(".".join(parts[:i]), set()).add(c)
    return {k: ",".join(sorted(v)) for k, v in kids.items()}


def add_predicates(preds, model):
    """What mlx-lm's per-model `cast_predicate` (which parameters `convert --dtype` leaves in
    their dtype) and `quant_predicate` (per module path: not quantized, or quantized with its own
    parameters) answer for this model's names, and which matrix-weighted modules it cannot
    quantize (`plain`): per pattern, each (name, parent's set of children)'s answer."""
    cast = getattr(model, "cast_predicate", None)
    quant = getattr(model, "quant_predicate", None)
    names = names_of(model)
    sib = siblings(names)
    parent = lambda n: sib.get(n.rsplit(".", 1)[0] if "." in n else "", "")  # noqa: E731
    if cast is not None:
        for k in names:
            preds.setdefault("cast", {}).setdefault(first_star(k), {})[(k, parent(k))] = bool(cast(k))
    # Modules with a matrix `weight` that mlx-lm cannot quantize (no `to_quantized`: a router
    # class of its own, a convolution): `nn.quantize` leaves them float whatever is asked.
    for path, m in model.named_modules():
        w = m.get("weight") if isinstance(m, dict) else None
        if path and not hasattr(m, "to_quantized") and getattr(w, "ndim", 0) >= 2:
            preds.setdefault("plain", {}).setdefault(first_star(path), {})[(path, parent(path))] = False
    if quant is not None:
        for path, m in model.named_modules():
            if hasattr(m, "to_quantized") and hasattr(m, "weight"):
                r = quant(path, m)
                r = r if isinstance(r, dict) else bool(r)
                preds.setdefault("quant", {}).setdefault(first_star(path), {})[(path, parent(path))] = r


def merge_predicates(preds, module):
    """Only what differs from mlx-lm's default (cast: True, quantize: True), per pattern; a
    pattern whose names get different answers (a predicate reading the layer's kind) is kept per
    set of the parent's children (`pattern|a,b,c`), else per name (`=name`)."""
    out = {}
    for kind in ("cast", "quant", "plain"):
        got = {}
        for pat, seen in sorted(preds.get(kind, {}).items()):
            answers = {json.dumps(v) for v in seen.values()}
            if len(answers) == 1:
                v = next(iter(seen.values()))
                if v is not True:
                    got[pat] = v
                continue
            by_set = {}
            for (_, kids), v in seen.items():
                by_set.setdefault(kids, set()).add(json.dumps(v))
            if all(len(a) == 1 for a in by_set.values()):
                for kids, a in sorted(by_set.items()):
                    got[pat + "|" + kids] = json.loads(next(iter(a)))
                continue
            print(f"{module}: {kind} {pat}: answers differ by name; kept per name", file=sys.stderr)
            for (name, _), v in sorted(seen.items()):
                got["=" + name] = v
        if got:
            out[kind] = got
    return out


def main():
    cases = {}
    skipped = {}
    graphs = {}
    configs = []
    for d in fixtures():
        rel = str(d.relative_to(ROOT))
        cfg = json.loads((d / "config.json").read_text())
        module = module_of(cfg)
        configs.append((rel, module, cfg))
        try:
            model, _ = load_model(d, lazy=True)
        except BaseException as e:  # a fixture mlx-lm does not load as it is (padded, staged)
            skipped[rel] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            continue
        names = names_of(model)
        add_order(graphs.setdefault(module, {}), names)
        ranked = sorted(names)
        pos = {n: i for i, n in enumerate(ranked)}
        cases[rel] = {
            "names_sha": hashlib.sha256("\n".join(ranked).encode()).hexdigest()[:16],
            "order": [pos[n] for n in names],
        }
        print(rel, len(names), file=sys.stderr)
    # Beyond the fixtures: mlx-lm's classes built from each fixture's config with every boolean
    # switch flipped in turn (a module a real checkpoint turns on that no fixture has: biases,
    # norms, shared experts, untied heads), merged into the table.
    built = 0
    preds = {}
    for rel, module, cfg in configs:
        try:
            add_predicates(preds.setdefault(module, {}), build(module, cfg))
        except BaseException:
            pass
        for sw in switches(module, cfg):
            try:
                model = build(module, with_switches(cfg, [sw]))
            except BaseException:  # a switch this class does not take alone
                continue
            add_order(graphs.setdefault(module, {}), names_of(model))
            add_predicates(preds.setdefault(module, {}), model)
            built += 1
    # Held out of the table: the same classes with many switches flipped at once (all, else
    # seeded random halves, else none), quantized where `nn.quantize` takes them (its names hold the float
    # model's, with `scales` and `biases`); `convert::every_served_type_` checks that the table
    # orders these names as mlx-lm does.
    rng = random.Random(34)
    heldout, seen = [], set()
    for rel, module, cfg in configs:
        sws = switches(module, cfg)
        tries = [sws] + [[s for s in sws if rng.random() < 0.5] for _ in range(3)] + [[]]
        for sw in tries:
            try:
                model = build(module, with_switches(cfg, sw))
                names, kind = names_of(model), "float"
            except BaseException:
                continue
            try:
                names, kind = names_of(quantized(model)), "4-bit"
            except BaseException:
                pass
            names = distinct_items(names)
            key = (module, kind, tuple(dict.fromkeys(pattern(n.split(".")) for n in names)))
            if key not in seen:
                seen.add(key)
                what = ",".join(f"{w + '.' if w else ''}{k}={v}" for w, k, v in sw)
                heldout.append({"type": cfg["model_type"], "from": rel, "kind": kind,
                                "switches": what, "names": delta(names)})
            break
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(k) + ": " + json.dumps(v, separators=(",", ":")) for k, v in sorted(cases.items())]
    text = '{"cases": {\n' + ",\n".join(lines) + '\n},\n"skipped": ' + json.dumps(skipped, indent=1, sort_keys=True) + "}\n"
    GOLDEN.write_text(text)
    held = [json.dumps(h, separators=(",", ":")) for h in heldout]
    HELDOUT.write_text("[\n" + ",\n".join(held) + "\n]\n")
    table = {t: merge(g, t) for t, g in sorted(graphs.items())}
    lines = [json.dumps(t) + ": " + json.dumps(v, separators=(",", ":")) for t, v in table.items()]
    TABLE.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    merged = {t: merge_predicates(p, t) for t, p in sorted(preds.items())}
    lines = [json.dumps(t) + ": " + json.dumps(v, separators=(",", ":")) for t, v in merged.items() if v]
    PREDICATES.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"{len(cases)} fixtures, {len(skipped)} skipped, {built} switched builds, "
          f"{len(heldout)} held-out orders, {len(table)} mlx-lm modules")


if __name__ == "__main__":
    main()
