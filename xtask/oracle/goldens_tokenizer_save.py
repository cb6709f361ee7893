"""transformers 5.25's tables that pick the tokenizer class `AutoTokenizer.from_pretrained`
loads (what mlx-lm's `save` re-saves), for `mlx_tokenizers::hf_save` (issue #34):
`TOKENIZER_MAPPING_NAMES` (model type to class, entries without a class left out),
`MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS` and the names of every tokenizer class transformers
has. Written to mlx-tokenizers/src/hf_tokenizer_classes.json.

Run with `cargo xtask goldens tokenizer_save`.
"""

import json
from pathlib import Path

import transformers
from transformers.models.auto import tokenization_auto as ta

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "mlx-tokenizers" / "src" / "hf_tokenizer_classes.json"


def main():
    mapping = {k: v for k, v in sorted(ta.TOKENIZER_MAPPING_NAMES.items()) if v}
    classes = sorted(
        {n.removesuffix("Fast") for n in dir(transformers) if n.endswith("Tokenizer") or n.endswith("TokenizerFast")}
    )
    doc = {
        "transformers": transformers.__version__,
        "mapping": mapping,
        "incorrect_hub_class": sorted(ta.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS),
        "classes": classes,
    }
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(OUT, len(mapping), "model types,", len(classes), "classes")


if __name__ == "__main__":
    main()
