"""The oracle half of `cargo xtask port-check` without a model directory: every model type of
mlx-lm 0.32.2's `models/` against what `mlx models --json` lists.

Usage: port_types.py MODELS.json

A model type is a module of `mlx_lm/models/` defining `ModelArgs` and defining or importing
`Model` (solar_open.py imports glm4_moe's; helpers such as `cache`, `rope_utils` or
`switch_layers` are not). Each must be listed by `mlx models`:
served (a table row or a dedicated port) or not served with a reason (`serving: "none"`).
Exits 1, naming them, when a type is neither (a new mlx-lm type nobody handled), when a type is
listed both ways, or when a listed unserved type is not one of mlx-lm's.
"""

import json
import pathlib
import re
import sys

import mlx_lm

listed = json.loads(pathlib.Path(sys.argv[1]).read_text())
served = {r["model_type"] for r in listed if r["serving"] != "none"}
unserved = {r["model_type"]: r for r in listed if r["serving"] == "none"}

models_dir = pathlib.Path(mlx_lm.__file__).parent / "models"
types = sorted(
    p.stem
    for p in models_dir.glob("*.py")
    if re.search(r"^(class Model\(|from \.\w+ import Model\b)", p.read_text(), re.M)
    and re.search(r"^class ModelArgs\b", p.read_text(), re.M)
)

problems = []
unhandled = [t for t in types if t not in served and t not in unserved]
if unhandled:
    problems.append(f"mlx-lm types neither served nor listed with a reason: {', '.join(unhandled)}")
both = sorted(served & set(unserved))
if both:
    problems.append(f"listed as served and as not served: {', '.join(both)}")
stale = sorted(set(unserved) - set(types))
if stale:
    problems.append(f"listed as not served but not a type of mlx-lm: {', '.join(stale)}")

n_served = sum(t in served for t in types)
no_cpu = [t for t in types if unserved.get(t, {}).get("unserved") == "no-cpu"]
print(f"mlx-lm {mlx_lm.__version__}: {len(types)} model types in models/")
print(f"  served: {n_served} (plus {len(served) - n_served} aliases)")
print(f"  not served: {len(types) - n_served - len(unhandled)}, of which cannot run on the CPU "
      f"backend: {', '.join(no_cpu) or 'none'}")
for p in problems:
    print(f"error: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
