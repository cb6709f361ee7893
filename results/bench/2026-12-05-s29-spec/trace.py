import json, sys
exec(open('sim.py').read().split('for learn in')[0])
V = json.load(open('vocab.json'))
tk = lambda ids: ''.join(V[i] for i in ids).replace('Ġ', ' ').replace('Ċ', '\\n')
print('PROMPT tail:', tk(prompt[-100:]))
print('REPLY:', tk(reply))
h = list(prompt); done = 0
while done < len(reply):
    h.append(reply[done]); done += 1
    if done == len(reply): break
    m = longest_match(h, 1)
    dr = drafts_of(h, 1, 4)
    n = 0
    while n < len(dr) and done + n < len(reply) and dr[n] == reply[done+n]: n += 1
    print(f"after {tk(h[-3:])!r:30} ctx={m[0] if m else 0:2} draft {tk(dr)!r:40} acc {n} next {tk(reply[done+n:done+n+1])!r}")
    h.extend(reply[done:done+n]); done += n
