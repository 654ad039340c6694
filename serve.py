"""
A playground in the browser over this project's checkpoints, and the OpenAI-style API behind it
(FastAPI on uvicorn; its docs at /docs): type a prompt and watch a GPT decode, with each token's
candidates before and after every decoding filter; type a headline and see the classifier's
probabilities and every attention head.
  python serve.py --out_dir=out-shakespeare-char-cpu --out_dir=out-agnews
      then open http://127.0.0.1:8000
  GET  /v1/models        the loaded checkpoints
  GET  /v1/options       every decoding option, as decoding.Options declares it
  POST /v1/completions   OpenAI's fields: prompt (a text, token ids, or a list of either),
                         max_tokens, n, stop, seed, stream (server-sent events), stream_options,
                         logprobs, echo, and every decoding option (OpenAI's defaults); vLLM's
                         ignore_eos: on past the end-of-text token; trace: the top candidates at
                         every filter
  POST /v1/chat/completions   OpenAI's messages (a chat fine-tune's model: lib/chat.py's template),
                         each reply ending at <|end|>; the same fields as completions but prompt,
                         logprobs, echo, trace, ignore_eos; max_completion_tokens; drop_oldest:
                         the oldest turns dropped from a conversation past the context
  POST /v1/classify      {"input": a text or a list of texts, "attention": true for one text's
                         every head}
  GET /tokenizer_info, POST /tokenize, POST /detokenize    vLLM's, which lm-evaluation-harness
                         reads to tokenize as the model does
Checkpoints load and decode through the library sample.py and classify.py use; a GPT's requests
share its engine's batch, step by step. Safe by default: only Host headers that name this server
(a page that rebinds its domain to this address sends its own), POST bodies of application/json
in UTF-8 only (what a page of another site cannot send without asking), no Origin but the server's
own unless --allow_origin names it. Bounded: every request has a deadline, connections and requests
in flight have a limit (a 503 past it), a completion's logprobs and trace a budget, a client that
leaves stops its decoding.
Bad input gets a 4xx and one JSON line naming the field: {"error": {"message", "type", "param"}}.
"""

import contextlib
import sys

from engine import COMPILE_OPTION
from lib.common import ArgumentParser, run_script
from lib.formats import WEIGHTS_OPTION
from lib.options import DEVICE_OPTION, Option, flags
from serving.app import Server
from serving.playground import Playground
from serving.scheduler import MAX_ROWS
from serving.transport import DEADLINE, exposure

FLAGS = {
    "host": Option(
        "127.0.0.1",
        "the address to listen on: 127.0.0.1 or ::1 for this machine only; 0.0.0.0 or :: for "
        "every network it is on",
    ),
    "port": Option(8000, "0: any free port", ge=0, le=65535),
    "device": DEVICE_OPTION,
    "weights": WEIGHTS_OPTION,
    "compile": COMPILE_OPTION,
    "max_rows": Option(
        MAX_ROWS,
        "a GPT's KV cache rows: the most choices decoding at once, in one batch; more wait their "
        "turn",
        ge=1,
    ),
    "max_tokens": Option(256, "the most tokens a request may ask for", ge=1),
    "max_n": Option(8, "the most completions a request may ask for", ge=1),
    "deadline": Option(
        DEADLINE,
        "seconds a request may take, to its last byte; a stream read slower is cut",
        ge=1,
    ),
}


def main(argv=None):
    p = ArgumentParser(prog="serve.py", description=__doc__)
    p.add_argument(
        "--out_dir",
        action="append",
        required=True,
        help="a checkpoint folder written by train.py (a GPT or a classifier); "
        "repeat it to serve several",
    )
    flags(p, FLAGS)
    p.add_argument(
        "--allow_origin",
        action="append",
        default=[],
        help="a web page's origin (such as http://localhost:3000) whose scripts may call the API; "
        "repeat it for several",
    )
    a = p.parse_args(argv)
    playground = Playground(
        a.out_dir, a.device, a.weights, a.max_tokens, a.max_n, rows=a.max_rows, compile=a.compile
    )
    server = Server(playground, a.host, a.port, origins=a.allow_origin, deadline=a.deadline)
    for name, m in playground.models.items():
        print(
            f"loaded {name}: {m['task']}, {m['parameters'] / 1e6:.2f}M parameters",
            file=sys.stderr,
        )
    warning = exposure(a.host)
    if warning:
        print(warning, file=sys.stderr)
    shown = f"[{a.host}]" if ":" in a.host else a.host
    print(f"serving on http://{shown}:{server.port} (Ctrl-C stops)", file=sys.stderr, flush=True)
    with contextlib.closing(server.socket):
        server.serve_forever()


if __name__ == "__main__":
    run_script(main, "serve.py")
