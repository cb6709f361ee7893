import json, sys
exec(open('sim.py').read().split('for learn in')[0])
for c in [0.42, 0.32, 0.25]:
  for k in [4,5,8,12]:
    h = list(prompt); done = 0; passes=rows=0; cost=0
    while done < len(reply):
        h.append(reply[done]); done += 1
        if done == len(reply): break
        m = longest_match(h, 1)
        dr = h[m[1]:m[1]+k] if m else []
        n = 0
        while n < len(dr) and done + n < len(reply) and dr[n] == reply[done+n]: n += 1
        dr = dr[:n]
        passes += 1; rows += len(dr); cost += 1 + c*len(dr) + (0.3 if len(dr)+1 > 6 else 0)
        h.extend(reply[done:done+n]); done += n
    print(f"c={c} oracle k={k}: passes {passes} drafts {rows} speedup {len(reply)/cost:.2f}x")
  for k in [4]:
    p, dr, a, s = run(k, False, cost_c=c)
    print(f"c={c} policy k=4: passes {p} drafts {dr} speedup {s:.2f}x")
