"""
serve.py under a bounded load on loopback: the server in its own process, then for each checkpoint
it serves, a round of requests a few at a time. Each answer is checked against the one the same
request gets alone (the same seed gives the same text, however the decoding steps of concurrent
requests interleave), and the server's resident memory is read after a warm-up round and after each
measured round: flat memory means no request leaves anything behind. With --big, each GPT's
rounds run again beside one more client that sends 64 prompts x 8 choices again and again: what
the other clients' latency pays for it. With --bad, they run again beside a client that sends
malformed and oversized requests (BAD) again and again, each of which must be refused with a 4xx,
and the engine's rows must all be free at the end. With --chat, each GPT's requests are chat
completions of data/chat/prepare.py's word tasks, for a checkpoint fine-tuned on them.
  python bench/serve_load.py --out_dir=out-shakespeare-char --out_dir=out-agnews \\
      --requests=200 --concurrency=8
  python bench/serve_load.py --out_dir=out-chat --chat --concurrency=1   # then 8: the ratio
"""

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

# run from anywhere: the repository root
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from engine import COMPILE_OPTION  # noqa: E402
from lib.common import ArgumentParser, Error, run_script  # noqa: E402
from lib.formats import WEIGHTS_OPTION  # noqa: E402
from lib.options import DEVICE_OPTION, Option, flags  # noqa: E402
from serving.transport import MAX_ACTIVE  # noqa: E402

HEADLINES = [
    "Stocks fall as oil prices jump",
    "Lakers win again in overtime",
    "New chip doubles battery life",
    "Talks on trade resume in Geneva",
    "Bank raises rates to cool prices",
    "Striker signs five-year deal",
    "Probe finds water ice on the moon",
    "Election results contested in court",
]

FLAGS = {
    "requests": Option(200, "requests per round", ge=1),
    "concurrency": Option(8, "requests in flight", ge=1),
    "rounds": Option(2, "measured rounds after the warm-up", ge=1),
    "distinct": Option(20, "distinct requests, each answered alone first", ge=1),
    "max_tokens": Option(32, "tokens per completion", ge=1),
    "big": Option(
        0,
        "> 0: each GPT's rounds again, beside one more client that sends 64 prompts x 8 choices "
        "of this many tokens, again and again; 0: none",
        ge=0,
    ),
    "bad": Option(
        False,
        "each GPT's rounds again, beside a client sending malformed and oversized requests",
    ),
    "chat": Option(
        False,
        "each GPT's requests as chat completions of the word tasks (config/chat.py's checkpoint)",
    ),
    "device": replace(DEVICE_OPTION, default="cpu"),
    "weights": WEIGHTS_OPTION,
    "compile": COMPILE_OPTION,
}

# refused before decoding: JSON that is not, wrong types, past the limits, more logprobs than a
# small vocabulary has (the served model's may take 20), logprobs and trace past their budget
# (some 60 MB of answer), a prompt past block_size
BAD = [
    b"{",
    {"prompt": 3},
    {"prompt": "ROMEO:", "max_tokens": -1},
    {"prompt": "ROMEO:", "temperature": "hot"},
    {"prompt": ["ROMEO:"] * 64, "n": 8, "max_tokens": 10**6},
    {"prompt": "ROMEO:", "max_tokens": 5, "logprobs": 21, "n": 8},
    {
        "prompt": ["ROMEO:"] * 8,
        "n": 8,
        "max_tokens": 256,
        "trace": 20,
        "logprobs": 20,
        "temperature": 0.9,
        "top_k": 40,
        "top_p": 0.9,
        "frequency_penalty": 0.3,
        "presence_penalty": 0.2,
        "repetition_penalty": 1.3,
        "no_repeat_ngram_size": 3,
    },
    {"prompt": "ROMEO: " * 10**5, "max_tokens": 5},
]


# a chat checkpoint's questions: data/chat/prepare.py's word tasks
QUESTIONS = [
    "Reverse: hello",
    "Capitals: stone",
    "Spell backwards: river",
    "Reverse: garden",
    "Capitals: candle",
    "Spell backwards: planet",
    "Reverse: silver",
    "Capitals: window",
]


def post(url, body):
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        raise Error(f"{url}: {e.code}: {json.loads(e.read())['error']['message']}") from None


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) / 1024


def start_server(out_dirs, device, weights, compile):
    """serve.py on a free port -> (the process, its base URL, its models)."""
    command = [
        sys.executable,
        os.path.join(ROOT, "serve.py"),
        *(f"--out_dir={d}" for d in out_dirs),
        "--port=0",
        f"--device={device}",
        f"--weights={weights}",
    ]
    if compile:
        command.append("--compile")
    # uvicorn logs each request on stdout
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in server.stderr:
        found = re.search(r"serving on (http://\S+)", line)
        if found:
            url = found.group(1)
            # the request log goes on: read it, or the server blocks once the pipe is full
            threading.Thread(target=server.stderr.read, daemon=True).start()
            with urllib.request.urlopen(url + "/v1/models") as response:
                return server, url, json.loads(response.read())["data"]
    raise Error(f"serve.py ended before serving: exit {server.wait()}")


def body_for(model, i, max_tokens, chat=False):
    if model["task"] == "classify":
        return "/v1/classify", {"model": model["id"], "input": HEADLINES[i % len(HEADLINES)]}
    drawn = {"model": model["id"], "max_tokens": max_tokens, "seed": i}
    drawn.update(temperature=0.8, top_k=200)
    if chat:
        messages = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        return "/v1/chat/completions", {**drawn, "messages": messages}
    prompt = ["ROMEO:", "JULIET:", "First Citizen:", "KING HENRY:"][i % 4]
    return "/v1/completions", {**drawn, "prompt": prompt}


def keep_sending(url, bodies, stop, statuses):
    """One client's loop: bodies (JSON, or bytes sent as they are) posted in turn until stop is
    set; each answer's status (200, or the refusal's) appended to statuses."""
    i = 0
    while not stop.is_set():
        body = bodies[i % len(bodies)]
        i += 1
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                response.read()
                statuses.append(response.status)
        except urllib.error.HTTPError as e:
            statuses.append(e.code)
            time.sleep(0.1)  # a refused client tries again, not at once


def measure(server, url, model, args, big=None):
    """One model's rounds: (requests/s, p50 and p99 latency in s, generated tokens/s, memory after
    each round). big: request bodies that one more client sends again and again meanwhile."""
    bodies = [body_for(model, i, args.max_tokens, args.chat) for i in range(args.distinct)]
    alone = [post(url + path, body) for path, body in bodies]
    stop = threading.Event()
    statuses = []
    if big is not None:
        sender = threading.Thread(
            target=keep_sending, args=(url + "/v1/completions", big, stop, statuses)
        )
        sender.start()

    def strip(answer):  # ids and timestamps differ by request
        return answer.get("choices", answer.get("data"))

    def one(i):
        path, body = bodies[i % len(bodies)]
        t0 = time.perf_counter()
        answer = post(url + path, body)
        if strip(answer) != strip(alone[i % len(bodies)]):
            raise Error(f"request {i} ({model['id']}) answered differently under load")
        return time.perf_counter() - t0, answer.get("usage", {}).get("completion_tokens", 0)

    memory, results = [], None
    with ThreadPoolExecutor(args.concurrency) as pool:
        for round_ in range(1 + args.rounds):  # the first warms up
            start = time.perf_counter()
            results = list(pool.map(one, range(args.requests)))
            seconds = time.perf_counter() - start
            memory.append(rss_mb(server.pid))
            print(
                f"{model['id']} round {round_}: {args.requests} requests in {seconds:.2f} s, "
                f"server RSS {memory[-1]:.1f} MB",
                file=sys.stderr,
            )
    stop.set()
    if big is not None:
        sender.join()
        codes = sorted(set(statuses))
        counts = ", ".join(f"{statuses.count(c)} x {c}" for c in codes)
        print(f"{model['id']}: the other client's answers: {counts}", file=sys.stderr)
        if big is BAD and any(not 400 <= code < 500 for code in statuses):
            raise Error(f"{model['id']}: a malformed request was not refused with a 4xx: {counts}")
    latencies = sorted(r[0] for r in results)

    def pick(q):
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))]

    return (
        args.requests / seconds,
        pick(0.5),
        pick(0.99),
        sum(r[1] for r in results) / seconds,
        memory,
    )


def check_rows_free(url, name):
    """Every KV cache row of model name free once the load is over (a refused request kept
    none)."""
    with urllib.request.urlopen(url + "/v1/models") as response:
        model = next(m for m in json.loads(response.read())["data"] if m["id"] == name)
    print(f"{name}: {model['free_rows']} of {model['rows']} rows free at the end", file=sys.stderr)
    if model["free_rows"] != model["rows"]:
        raise Error(f"{name}: {model['rows'] - model['free_rows']} rows lost to refused requests")


def main(argv=None):
    p = ArgumentParser(prog="serve_load.py", description=__doc__)
    p.add_argument(
        "--out_dir", action="append", required=True, help="a checkpoint to serve (repeatable)"
    )
    flags(p, FLAGS)
    args = p.parse_args(argv)
    if args.concurrency > MAX_ACTIVE:
        p.error(
            f"--concurrency {args.concurrency}: "
            f"serve.py decodes at most {MAX_ACTIVE} requests at once"
        )
    server, url, models = start_server(args.out_dir, args.device, args.weights, args.compile)
    try:
        rows = []
        for m in models:
            rows.append((m, "", *measure(server, url, m, args)))
            if args.big and m["task"] == "lm":
                prompts = [body_for(m, i, args.big)[1]["prompt"] for i in range(64)]
                big = {"model": m["id"], "prompt": prompts, "n": 8, "max_tokens": args.big}
                rows.append((m, " + big", *measure(server, url, m, args, [big])))
            if args.bad and m["task"] == "lm":
                rows.append((m, " + bad", *measure(server, url, m, args, BAD)))
                check_rows_free(url, m["id"])
    finally:
        server.terminate()
        server.wait()
    print(
        "| model | task | requests/s | p50 latency | p99 latency | tokens/s | "
        "server RSS after the warm-up, then each round (MB) |\n|---|---|---|---|---|---|---|"
    )
    for m, beside, rate, p50, p99, tokens, memory in rows:
        print(
            f"| {m['id']} | {m['task']}{beside} | {rate:.1f} | {1000 * p50:.0f} ms | "
            f"{1000 * p99:.0f} ms | {tokens:,.0f} | {' / '.join(f'{x:.1f}' for x in memory)} |"
        )


if __name__ == "__main__":
    run_script(main, "serve_load.py")
