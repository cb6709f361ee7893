"""mlx_lm.perplexity's own main on a local JSONL file: its `load_dataset` (Hugging Face
`datasets`, absent from the oracle venv) replaced by mlx-lm's `create_dataset` over the file's
records in file order, as `xtask/oracle/goldens_perplexity.py` does. Arguments as mlx_lm's."""
import json
import sys
import types

import mlx_lm.perplexity as ppl
from mlx_lm.tuner.datasets import create_dataset

path = sys.argv[sys.argv.index("--data-path") + 1]
rows = [json.loads(l) for l in open(path) if l.strip()]
ppl.load_dataset = lambda args, tok: (create_dataset(rows, tok, types.SimpleNamespace()), None, None)
sys.argv = ["perplexity"] + sys.argv[1:]
ppl.main()
