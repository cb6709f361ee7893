"""Load generator of `cargo xtask bench serve`: C concurrent clients against an
OpenAI-compatible server, standard library only.

    python bench_serve_client.py BASE_URL --clients 1,4,16,32 --max-tokens 64 [--rounds 2]

For each concurrency C, C threads each send `--rounds` streaming /v1/completions requests one
after another (the same short prompt, EOS suppressed with logit_bias so every request generates
exactly --max-tokens tokens, greedy) and count the tokens streamed back. Aggregate throughput is
all generated tokens / the wall time from the first request to the last token. Prints one JSON
line per concurrency: {"clients", "tokens", "seconds", "tokens_per_s", "errors"}.
"""

import argparse
import http.client
import json
import threading
import time
from urllib.parse import urlparse


def one_request(host, port, body):
    conn = http.client.HTTPConnection(host, port, timeout=3600)
    conn.request("POST", "/v1/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    tokens = 0
    usage = None
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            usage = chunk["usage"]
    conn.close()
    if usage is not None:
        tokens = usage["completion_tokens"]
    return tokens


def run(base, clients, max_tokens, rounds, prompt, eos):
    u = urlparse(base)
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    if eos:
        body["logit_bias"] = {str(t): -100 for t in eos}
    totals = [0] * clients
    errors = []

    def client(i):
        for _ in range(rounds):
            try:
                totals[i] += one_request(u.hostname, u.port, body)
            except Exception as e:  # noqa: BLE001
                errors.append(str(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.perf_counter() - t0
    tokens = sum(totals)
    return {"clients": clients, "tokens": tokens, "seconds": round(secs, 3),
            "tokens_per_s": round(tokens / secs, 2) if secs > 0 else 0.0,
            "errors": len(errors), "first_error": errors[0] if errors else None}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("base_url")
    p.add_argument("--clients", default="1,4,16,32")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--prompt", default="Once upon a time")
    p.add_argument("--eos", default="2", help="comma-separated EOS ids to suppress")
    a = p.parse_args()
    eos = [int(x) for x in a.eos.split(",") if x]
    # Warm-up: one short request.
    run(a.base_url, 1, 4, 1, a.prompt, eos)
    for c in [int(x) for x in a.clients.split(",")]:
        print(json.dumps(run(a.base_url, c, a.max_tokens, a.rounds, a.prompt, eos)), flush=True)


main()
