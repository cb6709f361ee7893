"""The held-out text of s31's seed choice: 80 Days (/work/trellis-models/s30/calib_80days.txt)
from the first paragraph break after character 180,000 (token 47,466 of 97,208) on. The s30
LDLQ Hessian used Genesis + this book's tokens 0-32,767, so the two texts are disjoint."""
from tokenizers import Tokenizer

t = Tokenizer.from_file("/work/trellis-models/smol-f32/tokenizer.json")
s = open("/work/trellis-models/s30/calib_80days.txt").read()
i = s.index("\n\n", 180000)
print("cut at char", i, "token", len(t.encode(s[:i], add_special_tokens=False).ids), "of", len(t.encode(s, add_special_tokens=False).ids))
open("/tmp/trellis/heldout_80days.txt", "w").write(s[i:].lstrip("\n"))
