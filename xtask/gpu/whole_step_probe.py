"""Upper-bound probe for a whole-step compiled decode on CUDA (issue #15): mlx-lm's llama
modules, one decode step over FIXED-capacity KV buffers (written with `mx.slice_update` at an
array offset, rope at an array offset, SDPA masked to the valid length), greedy argmax
inside, the whole step under one `mx.compile` (one trace for every step). Not bit-exact with
mlx-lm's sliced cache (the masked reduction runs over the whole capacity): a speed probe only.

    python whole_step_probe.py [bf16|q4 ...]     (prints one JSON line per model)
"""
import json, sys, time
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map
from mlx_lm.models import llama

CFG = {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30,
       "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
       "rms_norm_eps": 1e-05, "vocab_size": 49152, "rope_theta": 100000.0,
       "max_position_embeddings": 8192, "tie_word_embeddings": True}
CAP, START, N = 1024, 512, 128


def build(kind):
    mx.random.seed(7)
    m = llama.Model(llama.ModelArgs.from_dict(CFG))
    m.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.02, m.parameters()))
    m.set_dtype(mx.bfloat16)
    if kind == "q4":
        nn.quantize(m, group_size=64, bits=4)
    mx.eval(m.parameters())
    return m


def make_step(m):
    layers = m.model.layers
    L = len(layers)

    def step(tok, off, *kv):
        ks, vs = kv[:L], kv[L:]
        h = m.model.embed_tokens(tok)
        mask = (mx.arange(CAP) <= off)[None, None, None, :]
        nk, nv = [], []
        for i, layer in enumerate(layers):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = a.q_proj(x).reshape(1, 1, a.n_heads, -1).transpose(0, 2, 1, 3)
            k = a.k_proj(x).reshape(1, 1, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
            v = a.v_proj(x).reshape(1, 1, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
            q = a.rope(q, offset=off)
            k = a.rope(k, offset=off)
            kc = mx.slice_update(ks[i], k, off.reshape(1), axes=(2,))
            vc = mx.slice_update(vs[i], v, off.reshape(1), axes=(2,))
            o = mx.fast.scaled_dot_product_attention(q, kc, vc, scale=a.scale, mask=mask)
            h = h + a.o_proj(o.transpose(0, 2, 1, 3).reshape(1, 1, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            nk.append(kc)
            nv.append(vc)
        logits = m.model.embed_tokens.as_linear(m.model.norm(h))
        y = mx.argmax(logits[:, -1, :], axis=-1, keepdims=True).astype(mx.int32)
        return [y] + nk + nv

    return step


def run(step, m):
    L = len(m.model.layers)
    a = m.model.layers[0].self_attn
    hd = CFG["hidden_size"] // CFG["num_attention_heads"]
    kv = [mx.zeros((1, a.n_kv_heads, CAP, hd), mx.bfloat16) for _ in range(2 * L)]
    y = mx.array([[1]], mx.int32)
    mx.eval(kv)
    # warm up (traces)
    for n in range(4):
        out = step(y, mx.array(START + n, mx.int32), *kv)
        mx.eval(out)
        y, kv = out[0], out[1:]
    # synchronous steps: build / schedule / sync
    b, s, w = [], [], []
    for n in range(32):
        t0 = time.perf_counter()
        out = step(y, mx.array(START + n, mx.int32), *kv)
        t1 = time.perf_counter()
        mx.async_eval(out)
        t2 = time.perf_counter()
        mx.eval(out)
        t3 = time.perf_counter()
        b.append(t1 - t0); s.append(t2 - t1); w.append(t3 - t2)
        y, kv = out[0], out[1:]
    med = lambda v: sorted(v)[len(v) // 2] * 1e3
    # pipelined decode as generate_step does it: start step n+1, then read token n
    out = step(y, mx.array(START, mx.int32), *kv)
    mx.async_eval(out)
    t = time.perf_counter()
    for n in range(1, N + 1):
        nxt = step(out[0], mx.array(START + n, mx.int32), *out[1:])
        mx.async_eval(nxt)
        out[0].item()
        out = nxt
    dt = time.perf_counter() - t
    return {"build_ms": med(b), "schedule_ms": med(s), "sync_ms": med(w), "decode_tps": N / dt}


for kind in sys.argv[1:] or ["bf16", "q4"]:
    m = build(kind)
    raw = make_step(m)
    res = {"model": f"135m-{kind}", "capacity": CAP, "start": START}
    try:
        res["uncompiled"] = run(raw, m)
        res["compiled"] = run(mx.compile(raw), m)
    except Exception as e:  # report, go on
        res["error"] = repr(e)
    print(json.dumps(res), flush=True)
