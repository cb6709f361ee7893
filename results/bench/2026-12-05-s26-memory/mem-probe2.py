import sys
def st():
    return {l.split(':')[0]:int(l.split(':')[1].split()[0])//1024 for l in open('/proc/self/status') if l.startswith(('VmHWM','VmRSS'))}
import mlx.core as mx, glob
mx.set_default_device(mx.cpu)
print('import',st())
w={}
for f in glob.glob(sys.argv[1]+'/*.safetensors'): w.update(mx.load(f))
mx.eval(list(w.values()))
print('arrays MB',sum(a.nbytes for a in w.values())>>20,'after load',st(),'mlx peak',mx.get_peak_memory()>>20)
