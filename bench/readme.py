"""
The commands of README.md, then of the docs/ pages in PAGES' order, run in the order shown on a
fresh clone, offline: each one's exit status.
  python bench/readme.py          # trainings cut to --iters steps
  python bench/readme.py --long   # the multi-minute benchmarks too
  python bench/readme.py --list   # the commands, as the walk would run them; nothing runs
The clone is `git clone` of this checkout's HEAD into a temporary folder, with ../shared beside it
(a link to this checkout's), WANDB_MODE=offline, HF_HUB_OFFLINE=1 and TIKTOKEN_CACHE_DIR set.
Each ```bash block's lines, joined at a trailing backslash and cut at `&&`, run one at a time with
bash in the clone, changed only so:
- a line's `# offline: FLAGS` comment: FLAGS appended, the form the page gives for offline;
- train.py: --max_iters=ITERS --eval_iters=2 --eval_interval=ITERS appended, a run of seconds;
  rl.py: --max_iters=ITERS --eval_interval=ITERS;
- serve.py: started, waited on until it answers, stopped at the end of its page or at the
  page's next serve.py; port 8000 is taken by another free one throughout the page if something
  else holds it;
- `my_texts/`, the pages' stand-in for your text: Tiny Shakespeare cut into 8 files;
- each ```python block runs with python (beside the server it talks to);
- what SKIP names does not run, for the reason given.
"""

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
# the pages walked, in order: each page's commands need only what the pages before it made
PAGES = [
    "README.md",
    "docs/training.md",
    "docs/data.md",
    "docs/attention.md",
    "docs/generation.md",
    "docs/chat.md",
    "docs/serving.md",
    "docs/export.md",
    "docs/checkpoints.md",
    "docs/scaling.md",
    "docs/speed.md",
]
# (a pattern of a command, why the walk leaves it out); --long runs those marked long
SKIP = [
    (r"^pip install", "installs into this environment, which holds every extra already"),
    (r"python -m pytest", "the tests: CI runs them"),
    (r"^torchrun", "several GPUs, and OpenWebText or GPT-2's weights from the hub"),
    (r"bench/gpu\.sh", "a GPU"),
    (r"--init_from=gpt2", "GPT-2's weights from the hub: network"),
    (r"bench/speed\.py (--json|--time_to_loss)", "long: minutes of benchmarks"),
]
OFFLINE = re.compile(r"#\s*offline:\s*(.*)$")
COMMENT = re.compile(r"\s+#\s.*$")
PORT = 8000


def blocks(text):
    """[(language, [logical lines])] of a page's bash and python blocks, in order."""
    found = []
    lines = iter(text.splitlines())
    for line in lines:
        if line in ("```bash", "```python"):
            body = []
            for inner in lines:
                if inner == "```":
                    break
                body.append(inner)
            if line == "```python":
                found.append(("python", ["\n".join(body)]))
            else:
                joined = "\n".join(body).replace("\\\n", " ")
                found.append(("bash", [x for x in joined.splitlines() if x.strip()]))
    return found


def page_blocks():
    """[(page, language, [logical lines])] of every page's blocks, in PAGES' order."""
    found = []
    for page in PAGES:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            found += [(page, language, lines) for language, lines in blocks(f.read())]
    return found


def commands(line, iters):
    """A page's line -> the commands the walk runs for it: [(shown, run, why skipped or None)]."""
    offline = OFFLINE.search(line)
    line = COMMENT.sub("", line).strip()
    if offline:
        line = f"{line} {offline.group(1).strip()}"
    made = []
    for part in line.split(" && "):
        shown = part.strip()
        run = re.sub(r"\s+", " ", shown)
        why = next((why for pattern, why in SKIP if re.search(pattern, run)), None)
        if " train.py" in run and why is None:
            run += f" --max_iters={iters} --eval_iters=2 --eval_interval={iters}"
        if " rl.py" in run and why is None:
            run += f" --max_iters={iters} --eval_interval={iters}"
        made.append((shown, run, why))
    return made


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_taken(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_server(run, clone, env, port):
    """serve.py started in the clone -> its process, once it answers on port."""
    process = subprocess.Popen(
        ["bash", "-c", f"exec {run}"],
        cwd=clone,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(os.path.dirname(clone), "serve.log"), "w"),
        start_new_session=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5)
            return process
        except OSError:
            time.sleep(1)
    return process


def stop_server(process):
    """Ctrl-C, as a user stops it -> its exit status, 0 where it stopped as Ctrl-C stops it:
    uvicorn's shutdown ends in 0, or in 130 (interrupted) where the signal comes soon after
    its start."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
    try:
        status = process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait()
    return 0 if status == 130 else status


def interrupt(server, results):
    """stop_server(server), its status recorded in results and printed."""
    results.append(("(Ctrl-C) serve.py", stop_server(server)))
    print(f"exit {results[-1][1]:<4} (Ctrl-C) serve.py", flush=True)


def make_texts(clone):
    """my_texts/: Tiny Shakespeare in 8 files, 8 documents."""
    with open(os.path.join(SHARED, "data", "tinyshakespeare", "input.txt"), encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    os.makedirs(os.path.join(clone, "my_texts"))
    size = len(lines) // 8 + 1
    for i in range(8):
        with open(os.path.join(clone, "my_texts", f"{i}.txt"), "w", encoding="utf-8") as f:
            f.writelines(lines[i * size : (i + 1) * size])


def untracked(clone):
    """0 where the pages' commands left git status clean (what they write is ignored), else
    what they left, as a status line."""
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True
    )
    left = status.stdout.splitlines()
    return "; ".join(left[:8]) if left else 0


def walk(clone, env, iters, long):
    """Runs every command -> [(shown, status)], status an exit code or why it was skipped."""
    results = []
    server = None
    server_page = None
    port = PORT
    for page, language, lines in page_blocks():
        if server and page != server_page:
            interrupt(server, results)
            server = None
        for line in lines:
            if language == "python":
                parts = [("the python block", None, None)]
            else:
                parts = commands(line.replace(str(PORT), str(port)), iters)
            for shown, run, why in parts:
                if why and not (long and why.startswith("long")):
                    results.append((shown, f"skipped: {why}"))
                    print(f"skipped   {shown}  ({why})", flush=True)
                    continue
                if run and "serve.py" in run:
                    if server:  # the page's next server takes the place of the one running
                        interrupt(server, results)
                    if port_taken(port):  # someone else's server: this page takes another
                        port = free_port()
                        run = run.replace(str(PORT), str(port))
                        run += f" --port={port}"
                    server = start_server(run, clone, env, port)
                    server_page = page
                    up = server.poll() is None
                    results.append((shown, "started" if up else server.returncode))
                    print(f"{'started' if up else 'failed':9} {shown}", flush=True)
                    continue
                started = time.time()
                if language == "python":
                    code = line.replace(str(PORT), str(port))
                    status = subprocess.run(
                        [sys.executable, "-"],
                        input=code,
                        text=True,
                        cwd=clone,
                        env=env,
                        capture_output=True,
                    )
                else:
                    if "my_texts/" in run and not os.path.isdir(os.path.join(clone, "my_texts")):
                        make_texts(clone)
                    status = subprocess.run(
                        ["bash", "-c", run], cwd=clone, env=env, capture_output=True, text=True
                    )
                seconds = time.time() - started
                results.append((shown, status.returncode))
                print(f"exit {status.returncode:<4} {shown}  ({seconds:.0f} s)", flush=True)
                head = status.stdout.strip()[:160].replace("\n", " | ")
                print(f"          {head}", flush=True)  # that it answered, for a look
                if status.returncode:
                    print((status.stdout + status.stderr)[-2000:], flush=True)
                    break  # what follows && does not run
    if server:
        interrupt(server, results)
    return results


def listing(iters, long):
    """Prints what the walk would run, page by page, and what it would skip; runs nothing."""
    for page, language, lines in page_blocks():
        for line in lines:
            if language == "python":
                parts = [("the python block", "python - (the python block)", None)]
            else:
                parts = commands(line, iters)
            for shown, run, why in parts:
                if why and not (long and why.startswith("long")):
                    print(f"{page}: skipped ({why}): {shown}")
                else:
                    print(f"{page}: {run}")


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="readme.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--iters", type=int, default=4, help="train.py's steps (default: %(default)s)")
    p.add_argument("--long", action="store_true", help="run the benchmarks of minutes too")
    p.add_argument("--keep", action="store_true", help="keep the clone, and say where")
    p.add_argument("--list", action="store_true", help="print the commands it would run, and stop")
    a = p.parse_args(argv)
    if a.list:
        return listing(a.iters, a.long)
    if not os.path.isdir(SHARED):
        p.error(f"no {SHARED}: the offline commands read their files there")
    folder = tempfile.mkdtemp(prefix="readme-walk-")
    clone = os.path.join(folder, "gpt-starter")
    subprocess.run(["git", "clone", "-q", ROOT, clone], check=True)
    os.symlink(os.path.realpath(SHARED), os.path.join(folder, "shared"))
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",
        "TIKTOKEN_CACHE_DIR": os.path.join(folder, "shared", "tiktoken_cache"),
    }
    results = walk(clone, env, a.iters, a.long)
    results.append(("git status (clean after every command)", untracked(clone)))
    failed = [(shown, status) for shown, status in results if status not in (0, "started")]
    failed = [(shown, status) for shown, status in failed if not str(status).startswith("skip")]
    ran = sum(1 for _, status in results if not str(status).startswith("skip"))
    print(f"\n{ran} run, {len(results) - ran} skipped, {len(failed)} failed")
    for shown, status in failed:
        print(f"  failed ({status}): {shown}")
    if a.keep:
        print(f"the clone: {clone}")
    else:
        subprocess.run(["rm", "-rf", folder], check=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
