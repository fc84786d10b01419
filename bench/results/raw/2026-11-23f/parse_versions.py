import sys,re,collections
runs=[];cur=None
txt=open(sys.argv[1]).read().replace('ggml_backend_cuda_graph_compute: CUDA graph warmup complete\n','')
for l in txt.split('\n'):
    if l.startswith('device NVIDIA'):
        cur=[];runs.append(cur)
    elif l.startswith('q4_K') and cur is not None:
        f=l.split('|');a=f[0].split();b=f[1].split()
        m,n,T,sp=a[1],a[2],a[3],a[4]
        stock=float(l.split('stock')[1]) if 'stock' in l else None
        cur.append(((m,n,T,sp),float(b[0]),float(b[1]),float(b[3]),stock))
labels=sys.argv[2].split(',')
res=collections.defaultdict(lambda: collections.defaultdict(list))
for i,r in enumerate(runs):
    lab=labels[i%len(labels)]
    for k,d,idx,fu,st in r:
        res[k][lab].append((d,idx,fu,st))
print('| m x n | T | sp % | '+' | '.join(f'dense {l} | fused {l} | idx {l}' for l in labels)+' | stock (min) |')
print('|'+'---|'*(3+3*len(labels)+1))
for k in res:
    if k[3] not in ('0','50','65'): continue
    cells=[]
    stock=min(x[3] for l in labels for x in res[k][l] if x[3])
    for l in labels:
        v=res[k][l]
        cells+= [f'{min(x[0] for x in v):.2f}', f'{min(x[2] for x in v):.2f}', f'{min(x[1] for x in v):.2f}']
    print(f'| {k[0]}x{k[1]} | {k[2]} | {k[3]} | '+' | '.join(cells)+f' | {stock:.2f} |')
