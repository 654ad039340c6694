"""The walk of one run: the repository's Python files a command's processes import (imports inside
functions as far as the run takes them, the script run as __main__, and the files of the Python
processes it starts, torchrun's workers among them), each file's Python tokens (the tokenize
module's, less comments and layout, a string one token) and the share of its characters that are
docstrings; then the total.
  python bench/core_tokens.py -- python train.py config/shakespeare_char_cpu.py --max_iters=2"""

import argparse
import ast
import io
import os
import shlex
import subprocess
import sys
import tempfile
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from lib.common import ArgumentParser, Error, run_script

LAYOUT = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
    tokenize.ENCODING,
}

# every Python process of the run loads it at start (site imports sitecustomize from PYTHONPATH);
# at exit it appends the files of the modules the process holds to the files WALK_RECORD names
RECORDER = """import atexit, os, sys

def path(module):
    # __main__ has lost its __file__ by now; its loader keeps the script's path
    loader = getattr(module, "__loader__", None)
    return getattr(module, "__file__", None) or getattr(loader, "path", None)

def record():
    files = [path(m) for m in list(sys.modules.values())]
    for record in os.environ["WALK_RECORD"].split(os.pathsep):
        with open(record, "a") as f:
            f.write("".join(f"{os.path.abspath(p)}\\n" for p in files if p))

atexit.register(record)
"""


def tokens(source):
    read = io.BytesIO(source.encode()).readline
    return sum(1 for t in tokenize.tokenize(read) if t.type not in LAYOUT)


def docstring_chars(tree):
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    docs = [ast.get_docstring(n, clean=False) for n in ast.walk(tree) if isinstance(n, kinds)]
    return sum(len(d) for d in docs if d)


def walk(command):
    """The repository's .py files the command's processes had imported when they exited."""
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
            f.write(RECORDER)
        record = os.path.join(folder, "walk.txt")
        path = os.pathsep.join(p for p in (folder, os.environ.get("PYTHONPATH")) if p)
        # a walk within a walk: its processes' files count in both
        records = os.pathsep.join(r for r in (record, os.environ.get("WALK_RECORD")) if r)
        env = {**os.environ, "PYTHONPATH": path, "WALK_RECORD": records}
        status = subprocess.run(command, env=env).returncode
        if status:
            raise Error(f"{shlex.join(command)} exited with status {status}: no walk to count")
        if not os.path.exists(record):
            raise Error(f"{command[0]}: no Python process of it recorded its imports")
        with open(record) as f:
            files = {os.path.realpath(line.strip()) for line in f}
    inside = os.path.realpath(ROOT) + os.sep
    # a module may name a file that is not there (torch._classes: "_classes.py")
    return sorted(
        p for p in files if p.startswith(inside) and p.endswith(".py") and os.path.isfile(p)
    )


def main(argv):
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the run, after --")
    command = parser.parse_args(argv).command
    command = command[1:] if command[:1] == ["--"] else command
    if not command:
        raise Error("no command: give the run after --, e.g. -- python sample.py")
    counts = {}
    for path in walk(command):
        source = open(path).read()
        counts[path] = (tokens(source), docstring_chars(ast.parse(source)), len(source))
    total = [0, 0, 0]
    for path, count in sorted(counts.items(), key=lambda item: -item[1][0]):
        total = [a + b for a, b in zip(total, count)]
        share = count[1] / max(count[2], 1)
        print(f"{os.path.relpath(path, ROOT):22s} {count[0]:6,d}  docstrings {share:.1%}")
    name = f"the walk, {len(counts)} files"
    print(f"{name:22s} {total[0]:6,d}  docstrings {total[1] / max(total[2], 1):.1%}")


def script():
    main(sys.argv[1:])


if __name__ == "__main__":
    run_script(script, "core_tokens.py")
