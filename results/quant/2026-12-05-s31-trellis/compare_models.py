"""Which linears two trellis models code alike (same words and scales) and which seed each
kept: the numpy assembly (select_seeds.py) against `mlx convert --q-select-hessians`.

    python compare_models.py A_DIR B_DIR
"""
import json
import sys

import numpy as np
from safetensors.numpy import load_file

a, b = sys.argv[1], sys.argv[2]
ta, tb = load_file(f"{a}/model.safetensors"), load_file(f"{b}/model.safetensors")
qa, qb = (json.load(open(f"{d}/config.json"))["quantization"] for d in (a, b))
same = differ = 0
for k in sorted(ta):
    if not k.endswith(".scales") or k.replace(".scales", ".weight") not in ta:
        continue
    p = k[: -len(".scales")]
    eq = all(np.array_equal(ta[p + s], tb[p + s]) for s in (".weight", ".scales"))
    sa, sb = qa.get(p, qa).get("seed"), qb.get(p, qb).get("seed")
    same += eq
    differ += not eq
    if not eq or sa != sb:
        print(f"{p}: seeds {sa} / {sb}, tensors {'equal' if eq else 'differ'}")
print(f"{same} quantized modules equal, {differ} differ")
