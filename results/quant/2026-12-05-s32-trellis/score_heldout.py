"""The held-out loss (greedy_select.py's: np_llama forward, float32, the first 1,024 tokens of
80 Days from token 47,466 as 2 x 512) of assembled trellis models, each linear decoded with its
own quantization entry (per-linear seeds): does the held-out loss rank the models as Exodus
perplexity does?

    python score_heldout.py SRC_F32 HELDOUT.txt MODEL_DIR... > score_heldout.txt
"""
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

here = os.path.dirname(os.path.abspath(__file__))
src_le = open(os.path.join(here, "../2026-12-05-s29-trellis/layer_error.py")).read()
exec(src_le[: src_le.index("def main")])
sys.path.insert(0, here)
from np_llama import LIN, Llama  # noqa: E402

src, text, dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
model = Llama(json.load(open(f"{src}/config.json")), load_file(f"{src}/model.safetensors"))
ids = Tokenizer.from_file(f"{src}/tokenizer.json").encode(open(text).read(), add_special_tokens=False).ids
x = np.array(ids[: 2 * 513], dtype=np.int64).reshape(2, 513)
for d in dirs:
    q = json.load(open(f"{d}/config.json"))["quantization"]
    t = load_file(f"{d}/model.safetensors")
    model.embed = affine(t, "model.embed_tokens", {"bits": 4, "group_size": 64}).astype(np.float32)
    for l in range(model.nl):
        for n in LIN:
            p = f"model.layers.{l}.{n}"
            e = q.get(p, q) if isinstance(q.get(p), dict) else q
            model.set_linear(l, n, dequant(t[p + ".weight"], t[p + ".scales"], p, e))
    loss = model.loss_from(0, model.embed_ids(x[:, :-1]), x[:, 1:])
    print(os.path.basename(d), f"{loss:.5f}", flush=True)
