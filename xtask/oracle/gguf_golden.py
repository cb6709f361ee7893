"""What the GGUF golden scripts (`goldens_gguf_dense.py`, `goldens_gguf_mla.py`,
`goldens_gguf_more.py`) share: the seeded tiny mlx-lm model, llama.cpp's Q / K row
permutation, the metadata writer, the lossless write of the GGUF file and the recorded
logits (prefill, cached decode steps, a cache-less forward) that `cargo test -p mlx-models
--test integration gguf_dense::` compares ours with.
"""

import importlib
import os
import sys

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models.cache import make_prompt_cache

from golden import Golden

MODELS = "mlx-models/tests/models/gguf"
GOLDENS = "mlx-models/tests/goldens/gguf"
PROMPT = [2, 17, 90, 5, 42, 42, 7, 88, 3, 64]
STEPS = 5


def only():
    """The case names given after the script (all cases when none)."""
    return set(sys.argv[1:])


def seeded_model(model_type, config, seed):
    """`mlx_lm.models.<model_type>.Model` with every parameter `normal * 0.3` after
    `mx.random.seed(seed)`; returns (module, model)."""
    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.3, model.parameters()))
    mx.eval(model.parameters())
    return module, model


def permute(w, n_head):
    """convert_hf_to_gguf's LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class Meta:
    """GGUF metadata under `general.architecture` = arch: `num(key, v)` writes
    `<arch>.<key>` (uint32 unless a dtype is given), `str(key, s)` a string."""

    def __init__(self, arch):
        self.arch = arch
        self.m = {"general.architecture": arch}

    def num(self, k, v, dtype=mx.uint32):
        self.m[f"{self.arch}.{k}"] = mx.array(v, dtype=dtype)

    def f32(self, k, v):
        self.num(k, v, mx.float32)

    def str(self, k, s):
        self.m[f"{self.arch}.{k}"] = s

    def flag(self, k, b):
        self.m[f"{self.arch}.{k}"] = mx.array(b)


def write_gguf(name, tensors, meta):
    """Writes MODELS/<name>.gguf with `mx.save_gguf` and checks that `mx.load` gives every
    tensor back unchanged (f32: lossless); returns the path."""
    os.makedirs(MODELS, exist_ok=True)
    tensors = {k: mx.contiguous(a) for k, a in tensors.items()}
    path = f"{MODELS}/{name}.gguf"
    mx.save_gguf(path, tensors, meta.m if isinstance(meta, Meta) else meta)
    loaded = mx.load(path)
    assert sorted(loaded) == sorted(tensors), (sorted(loaded), sorted(tensors))
    for k, a in tensors.items():
        assert loaded[k].dtype == a.dtype and mx.array_equal(loaded[k], a).item(), k
    return path


def record(model, golden, script, one_token=False):
    """GOLDENS/<golden>.safetensors: the prefill of PROMPT, STEPS greedy cached decode steps
    and a cache-less forward of the whole sequence; `script` is the generator's __file__.
    `one_token`: a one-token prefill and no cache-less forward (mlx-lm's OLMo 1 adds the
    "causal" mask string to its scores, so it runs one token at a time)."""
    g = Golden(f"{GOLDENS}/{golden}.safetensors", script)
    cache = make_prompt_cache(model)
    ids = mx.array([PROMPT[:1] if one_token else PROMPT], dtype=mx.int32)
    logits = model(ids, cache=cache)
    g.case("prefill", "forward", [ids], logits)
    greedy = []
    for s in range(STEPS):
        nxt = mx.argmax(logits[:, -1, :], axis=-1).astype(mx.int32)
        greedy.append(nxt.item())
        ids = nxt[:, None]
        logits = model(ids, cache=cache)
        g.case(f"step{s}", "forward", [ids], logits)
    if not one_token:
        full_ids = mx.array([PROMPT + greedy], dtype=mx.int32)
        g.case("full", "forward_nocache", [full_ids], model(full_ids))
    g.meta["greedy"] = ",".join(map(str, greedy))
    g.save()
