"""Zeroes every CUDA image in libmlx.so's .nv_fatbin except the sm_90 machine code, so that
the library xz-packs to ~15 MB instead of ~69 MB (the images of sm_75/80/100/120/121 and the
sm_120 PTX are ~58 MB of the 67 MB fatbin section). The headers stay; the driver picks the
sm_90 image on an H100/H200 and never reads the others. Only for carrying libmlx to a lent
H200 (xtask/gpu/prepare_product.sh): the result runs nowhere else.

    python3 xtask/gpu/fatbin_sm90.py IN.so OUT.so
"""
import struct
import subprocess
import sys

src, dst = sys.argv[1], sys.argv[2]
f = bytearray(open(src, "rb").read())
sections = subprocess.run(["readelf", "-SW", src], capture_output=True, text=True, check=True).stdout
line = next(l for l in sections.splitlines() if " .nv_fatbin " in l)
fields = line.split("]", 1)[1].split()
off, size = int(fields[3], 16), int(fields[4], 16)
p, end, zeroed, kept = off, off + size, 0, 0
while p < end:
    magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", f, p)
    if magic != 0xBA55ED50:
        p += 8
        continue
    q, e = p + hsize, p + hsize + fsize
    while q < e:
        kind, _flags, ehsize, payload = struct.unpack_from("<HHIQ", f, q)
        arch = struct.unpack_from("<I", f, q + 28)[0]
        if (kind, arch) != (2, 90):  # 2: an ELF (SASS) image
            f[q + ehsize:q + ehsize + payload] = bytes(payload)
            zeroed += payload
        else:
            kept += payload
        q += ehsize + payload
    p = e
open(dst, "wb").write(f)
print(f"zeroed {zeroed} bytes of other images, kept {kept} bytes of sm_90 code")
