cd /work/wt-bits
for f in affine affine_nb16_mma1_wide1 bf16 affine_nb5_mma1_wide0 trellis576 affine_nb5_mma0_wide0; do
  python3 xtask/gpu/sass.py --source /tmp/dump50/$f.cu --kernel matvec --dump /tmp/dumpA/$f.main.sass > /tmp/dumpA/$f.main.log 2>&1
  python3 xtask/gpu/sass.py --source /tmp/dumpA/$f.cu --kernel matvec --dump /tmp/dumpA/$f.new.sass > /tmp/dumpA/$f.new.log 2>&1
  echo "== $f"; python3 /work/norm-dumps/sass_cmp.py /tmp/dumpA/$f.main.sass /tmp/dumpA/$f.new.sass 2>&1 | tail -8
done
echo done
