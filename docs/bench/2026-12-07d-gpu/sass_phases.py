import csv, collections, sys
rows=list(csv.reader(open('wu.csv')))
hdr=rows[1]; data=rows[2:]
ix={h:i for i,h in enumerate(hdr)}
stalls=[h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
tot=0; per=[]
for r in data:
    s=int(r[ix['Warp Stall Sampling (All Samples)']] or 0); tot+=s
    per.append((s,r[ix['Source']].strip(),r[ix['Address']],{h:int(r[ix[h]] or 0) for h in stalls}))
print('total samples',tot, 'instrs',len(data))
# cumulative by index with barrier markers
cum=0; seg=0; segs=[]
start=0
for k,(s,src,a,st) in enumerate(per):
    cum+=s
    if 'BAR.SYNC' in src or 'BAR ' in src or src.startswith('BAR'):
        segs.append((start,k,cum)); start=k+1; cum=0
segs.append((start,len(per)-1,cum))
for a,b,c in segs: print(f'seg {a:5d}-{b:5d} samples {c:7d} {100*c/tot:5.1f}%  ends: {per[b][1][:50]}')
op=collections.Counter(); ops=collections.defaultdict(collections.Counter)
for s,src,a,st in per:
    o=src.split()[0] if not src.startswith('@') else src.split()[1]
    o=o.split('.')[0]; op[o]+=s
    for h,v in st.items(): ops[o][h]+=v
print('by opcode:')
for o,v in op.most_common(25): print(f'{o:10s} {v:7d} {100*v/tot:5.1f}%', ', '.join(f'{h[6:]}:{c}' for h,c in ops[o].most_common(3)))
print('top instrs:')
for k,(s,src,a,st) in sorted(enumerate(per),key=lambda x:-x[1][0])[:40]:
    print(f'{k:5d} {s:6d} {100*s/tot:4.1f}% {src[:60]:60s}', ', '.join(f'{h[6:]}:{c}' for h,c in collections.Counter(st).most_common(2)))
