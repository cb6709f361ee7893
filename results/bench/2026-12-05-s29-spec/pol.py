import json, sys
exec(open('sim.py').read().split('def run(')[0])
def run(k, minctx=1, c=0.42, extra=lambda ln: 0):
    h = list(prompt); done = 0; passes = drafted = acc = 0; cost = 0.0
    while done < len(reply):
        h.append(reply[done]); done += 1
        if done == len(reply): break
        m = longest_match(h, 1)
        dr = []
        if m and m[0] >= minctx:
            ln, frm = m
            dr = h[frm:min(frm + min(k, ln + extra(ln)), len(h))]
        n = 0
        while n < len(dr) and done + n < len(reply) and dr[n] == reply[done+n]: n += 1
        passes += 1; drafted += len(dr); acc += n
        cost += 1 + c*len(dr) + (0.3 if len(dr) + 1 > 6 else 0)
        h.extend(reply[done:done+n]); done += n
    return passes, drafted, acc, len(reply)/cost
for c in [0.42, 0.32]:
  for k in [4,5,6,8]:
    for minctx in [1,2,3]:
        print(f"c={c} k={k} minctx={minctx}:", "passes %d drafted %d accepted %d speedup %.2fx" % run(k, minctx, c))
