"""Rope goldens: mlx-lm 0.32.2 `rope_utils.initialize_rope` for every scaling scheme (default,
linear, dynamic, llama3, yarn, longrope, proportional, mrope), applied to seeded inputs at
two offsets, in float32 and bfloat16. Configs that mlx-lm rejects (longrope without
`short_factor`, `long_factor` or `max_position_embeddings`; mrope without three sections) are
recorded as error cases (no outputs) after checking that mlx-lm raises.
Writes mlx-models/tests/goldens/rope.safetensors. Run with `cargo xtask goldens rope`.
"""

import json

import mlx.core as mx
from mlx_lm.models.rope_utils import initialize_rope

from golden import Golden

g = Golden("mlx-models/tests/goldens/rope.safetensors", __file__)
DIMS = 16
F8 = [1.0, 1.1, 1.3, 1.7, 2.0, 2.5, 3.0, 4.0]

CASES = [
    # name, scaling config, traditional, base, max_position_embeddings
    ("default", None, False, 10000.0, None),
    ("default_traditional", None, True, 500000.0, None),
    ("linear", {"type": "linear", "factor": 2.0}, False, 10000.0, None),
    ("dynamic", {"type": "dynamic", "factor": 2.0}, False, 10000.0, 8),
    ("llama3", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, False, 500000.0, 2048),
    ("yarn", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
              "beta_fast": 32, "beta_slow": 1}, False, 10000.0, 128),
    ("yarn_mscale_traditional", {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64,
                                 "mscale": 0.8, "mscale_all_dim": 0.5}, True, 10000.0, 512),
    ("deepseek_yarn", {"type": "deepseek_yarn", "factor": 2.0, "mscale": 1.0,
                       "mscale_all_dim": 1.0}, False, 10000.0, None),
    # long_mscale is not passed on by initialize_rope: the default scale applies.
    ("longrope", {"type": "longrope", "original_max_position_embeddings": 16,
                  "short_factor": [1.0] * 8, "long_factor": F8, "long_mscale": 3.0}, False, 10000.0, 64),
    ("longrope_short", {"type": "longrope", "original_max_position_embeddings": 64,
                        "short_factor": 1.0, "long_factor": 1.5}, False, 10000.0, 32),
    ("proportional", {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 2.0},
     False, 10000.0, None),
    ("mrope", {"type": "mrope", "mrope_section": [2, 3, 3]}, False, 1000000.0, None),
]

ERRORS = [
    ("longrope_no_short_factor", {"type": "longrope", "original_max_position_embeddings": 16,
                                  "long_factor": F8}, 64),
    ("longrope_no_long_factor", {"type": "longrope", "original_max_position_embeddings": 16,
                                 "short_factor": F8}, 64),
    ("longrope_no_max_position", {"type": "longrope", "original_max_position_embeddings": 16,
                                  "short_factor": F8, "long_factor": F8}, None),
    ("mrope_two_sections", {"type": "mrope", "mrope_section": [8, 8]}, None),
]


def cfg_str(c):
    s = json.dumps(c, separators=(",", ":"))
    assert ";" not in s and "=" not in s
    return s


mx.random.seed(0)
for name, cfg, trad, base, maxpos in CASES:
    rope = initialize_rope(DIMS, base, trad, cfg, maxpos)
    for dtype in (mx.float32, mx.bfloat16):
        x = mx.random.normal((1, 2, 5, DIMS)).astype(dtype)
        outs = [rope(x, offset=off) for off in (0, 7)]
        params = {"traditional": trad, "base": base, "offsets": [0, 7]}
        if cfg is not None:
            params["config"] = cfg_str(cfg)
        if maxpos is not None:
            params["max_position_embeddings"] = maxpos
        g.case(f"{name}_{'f32' if dtype == mx.float32 else 'bf16'}", "rope", [x], outs, **params)

for name, cfg, maxpos in ERRORS:
    try:
        rope = initialize_rope(DIMS, 10000.0, False, cfg, maxpos)
        rope(mx.zeros((1, 1, 2, DIMS)))
    except (KeyError, TypeError, AssertionError, ValueError) as e:
        err = type(e).__name__
    else:
        raise SystemExit(f"{name}: mlx-lm accepted it")
    params = {"config": cfg_str(cfg), "error": err, "traditional": False, "base": 10000.0}
    if maxpos is not None:
        params["max_position_embeddings"] = maxpos
    g.case(name, "rope_error", [mx.zeros((1,))], [], **params)

g.save()
