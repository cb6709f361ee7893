M=/tmp/trellis/mlx1
t() { local s=$(date +%s); "$@"; echo "$*: $(( $(date +%s) - s )) s, load $(cut -d' ' -f1 /proc/loadavg)" >> times.txt; }
for b in "$@"; do
t $M convert --hf-path f32 --mlx-path ldlq$b -q --q-mode trellis --q-bits $b --q-trellis-l 8 --q-hessians hess.safetensors
t $M convert --hf-path ldlq$b --mlx-path ldlq${b}_d -d
bash ppl.sh ldlq${b}_d
done
