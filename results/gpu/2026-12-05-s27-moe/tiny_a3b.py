# Writes a shrunken qwen3-30b-a3b-q4 through bench_models.py's own recipe (direct 4-bit
# params, nn.quantize(64, 4) over mlx-lm's qwen3_moe class), to check the decoder maps it.
import sys
src = open(sys.argv[1]).read().rsplit("\nmain()", 1)[0]
g = {"__name__": "bench_models"}
exec(compile(src, "bench_models.py", "exec"), g)
base = dict(g["BASE_QWEN3_30B_A3B"], num_hidden_layers=2, vocab_size=1024, hidden_size=256,
            num_attention_heads=4, num_key_value_heads=2)
g["MODELS"]["tiny-a3b-q4"] = (base, "bfloat16", (64, 4), True)
g["write"](sys.argv[2], "tiny-a3b-q4")
