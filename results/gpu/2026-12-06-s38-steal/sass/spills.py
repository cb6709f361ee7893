"""Spill instructions and atomics per row kernel in two sass.py --dump files (sass_off.txt,
sass_on.txt: --mv-async without and with --steal), and those inside the innermost loops."""
import re, sys
def fn(path, name):
    out=[]; f=False
    for l in open(path):
        if l.startswith(f".text.{name}:"): f=True; continue
        if f and l.startswith("//----"): break
        if f: out.append(l)
    return out
for name in ["matvec","matvec_qkv","matvec_attn_out","matvec_experts"]:
    for side in ["off","on"]:
        lines = fn(f"sass_{side}.txt", name)
        n=0; sp=[]; at=0; back=[]
        for l in lines:
            m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*)", l)
            if not m: continue
            i = int(m.group(1),16)//16; ins = m.group(2); n=i
            if re.search(r"\b(STL|LDL)", ins): sp.append(i)
            if "ATOMG" in ins or "RED." in ins: at+=1
        print(f"{name:16s} {side:3s} instructions {n+1:6d} spill instructions {len(sp):3d} atomics {at:3d} first/last spill at {sp[:3]}..{sp[-3:]}")

# Spill instructions inside the innermost loops sass.py --kernel K lists (K_loops_SIDE.txt).
for name in ["matvec", "matvec_qkv", "matvec_experts"]:
    for side in ["off", "on"]:
        loops = [tuple(map(int, m.groups())) for m in
                 re.finditer(r"^\s+(\d+)-(\d+) \(", open(f"{name}_loops_{side}.txt").read(), re.M)]
        sp = [int(m.group(1), 16) // 16 for l in fn(f"sass_{side}.txt", name)
              for m in [re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*)", l)]
              if m and re.search(r"\b(STL|LDL)", m.group(2))]
        inside = [i for i in sp if any(a <= i <= b for a, b in loops)]
        print(f"{name:16s} {side:3s} loops {len(loops)} ({sum(b - a + 1 for a, b in loops)} instructions), "
              f"spill instructions inside them {len(inside)}")
