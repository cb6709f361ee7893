import sys, os
def st():
    d={}
    for l in open('/proc/self/status'):
        if l.startswith(('VmHWM','VmRSS','RssFile','RssAnon')): k,v=l.split(':'); d[k]=int(v.split()[0])//1024
    return d
import mlx.core as mx
mx.set_default_device(mx.cpu)
print('after import', st())
p=sys.argv[1]
w=mx.load(p)
mx.eval(list(w.values()))
nb=sum(a.nbytes for a in w.values())
print('after mx.load gguf: arrays %d MB'%(nb>>20), st())
print('mlx active/cache/peak MB', mx.get_active_memory()>>20, mx.get_cache_memory()>>20, mx.get_peak_memory()>>20)
