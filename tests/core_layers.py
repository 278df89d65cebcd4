#!/usr/bin/env python3
"""No loops between libdcp's files: from the symbols each object of libdcp
defines and uses (nm), the graph "file A calls a function of file B", and
its strongly connected components (Tarjan). Prints each loop; exits 1 if
there is one. usage: core_layers.py BUILDDIR"""
import collections
import os
import subprocess
import sys

objs = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(sys.argv[1], 'src'))
        for f in fs if f.startswith('libdcp_la-') and f.endswith('.o')]
seen = {}
for o in sorted(objs):       # libtool: PIC objects in .libs/, maybe static ones beside them
    seen.setdefault(os.path.basename(o), o)
objs = list(seen.values())
if not objs:
    print('no libdcp objects under', sys.argv[1]); sys.exit(77)
defs = {}; undef = collections.defaultdict(set)
for o in objs:
    name = os.path.basename(o)[len('libdcp_la-'):-2]
    for line in subprocess.run(['nm', o], capture_output=True, text=True).stdout.splitlines():
        p = line.split()
        if len(p) == 3 and p[1] in 'TDBR': defs[p[2]] = name
        elif len(p) == 2 and p[0] == 'U': undef[name].add(p[1])
g = {n: {defs[s] for s in u if s in defs and defs[s] != n} for n, u in undef.items()}
# strongly connected components (Tarjan)
idx = {}; low = {}; st = []; on = set(); out = []; c = [0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in g.get(v, ()):
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: out.append(comp)
for v in list(g): 
    if v not in idx: sc(v)
print(f"{len(g)} files of libdcp, {sum(len(v) for v in g.values())} calls between files")
for comp in out:
    print("loop:", " <-> ".join(sorted(comp)))
sys.exit(1 if out else 0)
