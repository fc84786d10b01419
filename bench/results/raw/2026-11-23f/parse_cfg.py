# table of bench-cfg.log: default launch config (rounds "N1=-1") against n1 = 16 ("N1=16"), smaller of two rounds
import collections, sys
txt = open(sys.argv[1]).read().replace('ggml_backend_cuda_graph_compute: CUDA graph warmup complete\n', '')
runs, cur = [], None
for l in txt.split('\n'):
    if l.startswith('-- round'):
        cur = []
        runs.append((l, cur))
    elif l.startswith('q4_K') and '|' in l and cur is not None:
        f = l.split('|'); a = f[0].split(); b = f[1].split(); c = f[3].split()
        cur.append((a[1] + 'x' + a[2], a[3], a[4], float(b[0]), float(b[1]), float(b[3]), c[0]))
res = collections.defaultdict(lambda: collections.defaultdict(list))
for lab, r in runs:
    key = 'new' if 'N1=-1' in lab else 'old'
    for sh, T, sp, d, idx, fu, n1 in r:
        res[(sh, T, sp)][key].append((d, idx, fu, n1))
print('| m x n | T | sp % | n1 new | dense new | dense n1=16 | ratio | fused new | fused n1=16 | ratio | idx new | idx n1=16 |')
print('|---|---|---|---|---|---|---|---|---|---|---|---|')
for k, v in res.items():
    if k[2] not in ('0', '50', '65'):
        continue
    n, o = v['new'], v['old']
    dn, do = min(x[0] for x in n), min(x[0] for x in o)
    fn, fo = min(x[2] for x in n), min(x[2] for x in o)
    print(f'| {k[0]} | {k[1]} | {k[2]} | {n[0][3]} | {dn:.2f} | {do:.2f} | {do/dn:.2f} | {fn:.2f} | {fo:.2f} | {fo/fn:.2f} | '
          f'{min(x[1] for x in n):.2f} | {min(x[1] for x in o):.2f} |')
