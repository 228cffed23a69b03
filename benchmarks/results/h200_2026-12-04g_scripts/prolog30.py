# ruff: noqa  (session 30: SASS instructions of the tc split kernel between the PDL wait and the tile loop)
import re, sys, collections
lines=open(sys.argv[1]).read().splitlines()
addr=[]
for l in lines:
    m=re.search(r'/\*([0-9a-f]{4,})\*/\s+(.*?);',l)
    if m: addr.append((int(m.group(1),16), re.sub(r'^@!?U?P\w+\s+','',m.group(2).strip()).split()[0]))
acq=[a for a,o in addr if o=='ACQBULK']
# main wait: the ACQBULK not followed by EXIT
ops=dict(addr)
main=[a for a in acq if ops.get(a+16)!='EXIT'][0]
# loop start: first backward-branch target > main with span > 300
loop=None
for l in lines:
    m=re.search(r'/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?BRA(\.\w+)*\s+(\w+,\s*)?(0x[0-9a-f]+)',l)
    if m:
        a=int(m.group(1),16); t=int(m.group(5),16)
        if t<a and t>main and a-t>3000 and a < 0x20000 and (loop is None): loop=(t,a)
c=collections.Counter(o for a,o in addr if main<=a<loop[0])
print('prologue', sum(c.values()), 'loop', (loop[1]-loop[0])//16, c.most_common(12))
