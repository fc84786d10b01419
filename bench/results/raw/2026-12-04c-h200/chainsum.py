import re,sys,collections
d=collections.defaultdict(list); cur=None
for line in open(sys.argv[1]):
    m=re.match(r"-- round (\d+) (\S+)",line)
    if m: cur=m.group(2); continue
    m=re.match(r"\s*(\d+)\s+(\d+)%\s+\|\s+([\d.]+)",line)
    if m and cur: d[(cur,int(m.group(1)),int(m.group(2)))].append(float(m.group(3)))
builds=[]; 
for k in d:
    if k[0] not in builds: builds.append(k[0])
keys=sorted({(k[1],k[2]) for k in d})
base=sys.argv[2] if len(sys.argv)>2 else builds[0]
print('batch lvl | '+' | '.join(builds))
for b,l in keys:
    bm=sum(d[(base,b,l)])/len(d[(base,b,l)])
    row=[]
    for x in builds:
        v=d.get((x,b,l))
        if not v: row.append('-'); continue
        m=sum(v)/len(v); row.append(f"{m:.1f} ({(m/bm-1)*100:+.1f}%)")
    print(f"{b} {l}% | "+' | '.join(row))
