"""Issue #38 scenario against a running `mlx serve`: a stream runs, a large embeddings request
and a long prompt arrive, small requests are sent meanwhile; prints the stream's worst gap, the
small requests' latencies and the server's VmRSS before / peak / after."""
import json, sys, threading, time
import requests

url, pid = sys.argv[1], int(sys.argv[2])
n_inputs, input_len, prompt_words = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
vocab_lo, vocab_hi = int(sys.argv[6]), int(sys.argv[7])
eos = [int(x) for x in sys.argv[8].split(",")]

def rss():
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS:"):
            return int(l.split()[1])

def post(path, body, timeout=3600):
    return requests.post(url + path, json=body, timeout=timeout)

post("/v1/completions", {"prompt": "hi", "max_tokens": 4})
post("/v1/embeddings", {"input": [[vocab_lo + 5, vocab_lo + 6]]})
time.sleep(1.0)
before = rss()
peak = [before]
sampling = [True]
def sampler():
    while sampling[0]:
        peak[0] = max(peak[0], rss()); time.sleep(0.05)
threading.Thread(target=sampler, daemon=True).start()

bias = {str(e): -100 for e in eos}
stream = requests.post(url + "/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 8000,
    "stream": True, "logit_bias": bias}, stream=True, timeout=3600)
lines = stream.iter_lines()
times = []
def reader():
    for l in lines:
        if l.startswith(b"data: ") and l != b"data: [DONE]":
            times.append(time.monotonic())
            if stop[0]:
                break
stop = [False]
got = 0
while len(times) < 5:
    l = next(lines)
    if l.startswith(b"data: "):
        times.append(time.monotonic())
t_reader = threading.Thread(target=reader, daemon=True); t_reader.start()

span = vocab_hi - vocab_lo
inputs = [[vocab_lo + (i * 31 + j * 7) % span for j in range(input_len)] for i in range(n_inputs)]
prompt = " ".join(f"w{(i * 7919) % 100000}" for i in range(prompt_words))
res = {}
start = time.monotonic()
def big_embed():
    r = post("/v1/embeddings", {"input": inputs}); res["embed"] = (r.status_code, time.monotonic() - start, r.json().get("usage"))
def big_prompt():
    r = post("/v1/completions", {"prompt": prompt, "max_tokens": 2}); res["long"] = (r.status_code, time.monotonic() - start, r.json().get("usage"))
threads = [threading.Thread(target=big_embed), threading.Thread(target=big_prompt)]
for t in threads: t.start()
time.sleep(0.5)
small = []
for i in range(3):
    t = time.monotonic(); r = post("/v1/completions", {"prompt": f"small {i}", "max_tokens": 4})
    small.append(("completion", r.status_code, round(time.monotonic() - t, 3), round(time.monotonic() - start, 2)))
    t = time.monotonic(); r = post("/v1/embeddings", {"input": [[vocab_lo + 1, vocab_lo + 2, vocab_lo + 3]]})
    small.append(("embedding", r.status_code, round(time.monotonic() - t, 3), round(time.monotonic() - start, 2)))
for t in threads: t.join()
end = start + max(res["embed"][1], res["long"][1])
stop[0] = True
time.sleep(0.5)
stream.close()
during = [t for t in times if start <= t <= end]
gaps = [b - a for a, b in zip(during, during[1:])]
worst = max(gaps + [during[0] - start if during else 0])
for _ in range(500):
    h = requests.get(url + "/health").json()
    if h["active"] == 0 and h["queued_tokens"] == 0:
        break
    time.sleep(0.05)
time.sleep(1.5)
sampling[0] = False
after = rss()
print(json.dumps({"large": res, "stream_tokens_during": len(during), "worst_gap_s": round(worst, 3),
    "stream_last_after_end": bool(times and times[-1] >= end),
    "small": small, "rss_kb": {"before": before, "peak": max(peak[0], after), "after": after}}, indent=1))
