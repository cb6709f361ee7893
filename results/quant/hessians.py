"""Writes the input second moments H = X^T X / n of chosen linears of a float32 model (inputs
from the model's forward over the first N tokens of KJV Exodus, exodus_kjv_1-16.txt):

    python hessians.py F32_DIR N OUT.safetensors model.layers.0.self_attn.q_proj ...

Keys: `<path>.hessian` (float32, in x in) and `<path>.weight` (the float32 weight)."""
import sys
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.utils import load

f32_dir, ntok, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
want = set(sys.argv[4:])
model, tok = load(f32_dir)
text = open(__file__.rsplit("/", 1)[0] + "/exodus_kjv_1-16.txt").read()
ids = mx.array(tok.encode(text)[:ntok])[None]
res = {}

class Tap(nn.Module):
    def __init__(self, lin, key):
        super().__init__()
        self.lin, self.key = lin, key
    def __call__(self, x):
        x2 = x.reshape(-1, x.shape[-1]).astype(mx.float32)
        res[self.key + ".hessian"] = x2.T @ x2 / x2.shape[0]
        res[self.key + ".weight"] = self.lin.weight.astype(mx.float32)
        return self.lin(x)

for i, layer in enumerate(model.model.layers):
    for n in ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]:
        key = f"model.layers.{i}.{n}"
        if key in want:
            parent, attr = n.split(".")
            mod = getattr(layer, parent)
            setattr(mod, attr, Tap(getattr(mod, attr), key))
mx.eval(model(ids))
mx.save_safetensors(out, res)
print(sorted(res))
