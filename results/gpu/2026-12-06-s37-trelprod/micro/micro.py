"""One product loop of the states' table (TRELLIS_STATES) in a small kernel, compiled by NVRTC sm_90
(sass.py's compiler and options), its loop's instruction mix: `python3 micro.py VARIANT [selc]`
(VARIANT.cu beside this file; NVRTC_LIB/NVDISASM as sass.py)."""
import sys, os, re, subprocess, collections
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "..", "xtask", "gpu"))
os.environ.setdefault("NVRTC_LIB", "/tmp/trelprod/nv/cu13/lib/libnvrtc.so.13")
import sass
variant = sys.argv[1]
SELC = len(sys.argv) > 2
body = open(os.path.join(HERE, f"{variant}.cu")).read()
pre = r"""
typedef unsigned int u32; typedef unsigned long long u64; typedef long long ll;
__device__ __forceinline__ float* lutp() { extern __shared__ __align__(16) unsigned char smem[]; return (float*)smem; }
"""
post = r"""
extern "C" __global__ void __launch_bounds__(256, 4) k(const u32* W, float* z, int nb) {
  const float* xs = lutp() + 32768;
  const float* lut = lutp();
  const u32 lane4 = 4u * (threadIdx.x & 31);
  float acc = 0.f;
  const u32* row = W + blockIdx.x * 1024;
  for (int b = threadIdx.x & 31; b < nb; b += 32) {
    u32 w[6];
    const uint2* p = (const uint2*)(row + b * 6);
    for (int i = 0; i < 3; ++i) { uint2 v = p[i]; w[2*i] = v.x; w[2*i+1] = v.y; }
    acc += blk(w, xs + b * 66, lut, lane4 SELARG);
  }
  z[blockIdx.x * 256 + threadIdx.x] = acc;
}
"""
post = post.replace("SELARG", ", 0x7650u | ((u32)nb >> 31)" if SELC else "")
cubin, log = sass.compile_cubin(pre + body + post)
import tempfile
cub = os.path.join(tempfile.mkdtemp(), "k.cubin")
open(cub, "wb").write(cubin)
out = subprocess.run([sass.NVDISASM, "-c", cub], capture_output=True, text=True).stdout
_, lp = sass.loops(out, "k", 100)
for s0, s1, mix in lp:
    print(variant, "loop", s1 - s0 + 1, "per FFMA %.2f" % ((s1 - s0 + 1) / max(1, mix["FFMA"])), dict(mix.most_common(12)))
ins = [l for l in out.split("\n") if re.search(r"/\*[0-9a-f]{4,}\*/", l)]
ops = [re.sub(r"^.*\*/\s*(@!?U?P\w+\s+)?", "", l).split()[0].split(".")[0] for l in ins if ";" in l]
c = collections.Counter(ops)
print(variant, "total", len(ops), "FFMA", c["FFMA"], "per FFMA %.2f" % (len(ops) / max(1, c["FFMA"])), dict(c.most_common(12)))
print(re.findall(r"Used \d+ registers.*", log))
