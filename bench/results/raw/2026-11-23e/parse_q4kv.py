import re,sys
runs=[]; cur=None
for line in open(sys.argv[1]):
    if line.startswith('type'):
        cur={}; runs.append(cur); continue
    m=re.match(r'q4_K\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+) \|((?:\s+[0-9.]+){7}) \|',line)
    if m and cur is not None:
        key=tuple(int(m.group(i)) for i in range(1,5))
        v=[float(x) for x in m.group(5).split()]
        s=re.search(r'stock ([0-9.]+)',line)
        cur[key]=(v, float(s.group(1)) if s else 9e9)
R=runs
print(len(R), [len(r) for r in R])
keys=sorted(R[0].keys())
print("| m x n | T | sp % | dense v1 | dense v2 | dense v2+pf | fused v1 | fused v2 | fused v2+pf | idx v1 | idx v2 | idx v2+pf | stock mmvq (min) | stock / v2 dense | stock / v2 fused |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for key in keys:
    if key[3] not in (0,50,65): continue
    def col(c): return [min(R[i][key][0][c],R[i+3][key][0][c]) for i in range(3)]
    d=col(0); fu=col(3); ix=col(1)
    st=min(R[i][key][1] for i in range(6))
    print("| %dx%d | %d | %d | "%key + " | ".join("%.2f"%v for v in d+fu+ix) + " | %.2f | %.2fx | %.2fx |"%(st, st/d[1], st/fu[1]))
