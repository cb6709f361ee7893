"""Weight error and activation-weighted output error of each linear of SmolLM2-135M, affine
(mx.quantize, group 64) against trellis (a `mlx convert -q --q-mode trellis` model turned back
into dense weights with `mlx convert -d`), on the inputs the float32 model feeds each linear
for the first tokens of KJV Exodus.

    python act_error.py F32_DIR TOKENS [NAME=DEQUANTIZED_DIR ...]

Prints, per bit width and matrix type, the mean over layers of ||dW||^2/||W||^2 (weight) and
||X dW^T||^2/||X W^T||^2 (output)."""
import sys, glob
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.utils import load

f32_dir, ntok = sys.argv[1], int(sys.argv[2])
others = dict(a.split("=", 1) for a in sys.argv[3:])
model, tok = load(f32_dir)
text = open(__file__.rsplit("/", 1)[0] + "/exodus_kjv_1-16.txt").read()
ids = mx.array(tok.encode(text)[:ntok])[None]

NAMES = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
H = {}

class Tap(nn.Module):
    def __init__(self, lin, key):
        super().__init__()
        self.lin, self.key = lin, key
    def __call__(self, x):
        x2 = x.reshape(-1, x.shape[-1]).astype(mx.float32)
        H[self.key] = x2.T @ x2
        return self.lin(x)

for i, layer in enumerate(model.model.layers):
    for n in NAMES:
        parent, attr = n.split(".")
        mod = getattr(layer, parent)
        setattr(mod, attr, Tap(getattr(mod, attr), f"model.layers.{i}.{n}"))
mx.eval(model(ids))
mx.eval(H)

def weights(d):
    w = {}
    for f in glob.glob(d + "/*.safetensors"):
        w.update(mx.load(f))
    return w

W = weights(f32_dir)
rows = {}
def measure(tag, key, dw, w):
    h = H[key]
    werr = (dw * dw).sum() / (w * w).sum()
    oerr = ((dw @ h) * dw).sum() / ((w @ h) * w).sum()
    rows.setdefault(tag, {}).setdefault(key.split(".", 3)[3], []).append((werr.item(), oerr.item()))

for key in H:
    w = W[key + ".weight"].astype(mx.float32)
    for b in (2, 3, 4):
        q = mx.quantize(w, 64, b)
        measure(f"affine{b}", key, mx.dequantize(*q, 64, b) - w, w)
for tag, d in others.items():
    Wq = weights(d)
    for key in H:
        w = W[key + ".weight"].astype(mx.float32)
        measure(tag, key, Wq[key + ".weight"].astype(mx.float32) - w, w)

print(f"{ntok} tokens; mean over 30 layers: weight error / output error (relative)")
for tag, per in rows.items():
    parts = []
    allw, allo = [], []
    for n, v in per.items():
        mw = sum(a for a, _ in v) / len(v); mo = sum(b for _, b in v) / len(v)
        allw.append(mw); allo.append(mo)
        parts.append(f"{n.split('.')[-1]} {mw:.4f}/{mo:.4f}")
    print(f"{tag}: all {sum(allw)/len(allw):.4f}/{sum(allo)/len(allo):.4f}; " + ", ".join(parts))
