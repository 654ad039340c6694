"""The core's size: Python tokens of train.py, sample.py and every repository module they import
(imports inside functions too), the tokenize module's tokens less comments and layout, a string one
token; and the share of each file's characters that are docstrings.
  python bench/core_tokens.py [REPO]"""

import ast
import io
import os
import sys
import tokenize

LAYOUT = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
    tokenize.ENCODING,
}


def tokens(source):
    read = io.BytesIO(source.encode()).readline
    return sum(1 for t in tokenize.tokenize(read) if t.type not in LAYOUT)


def docstring_chars(tree):
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    docs = [ast.get_docstring(n, clean=False) for n in ast.walk(tree) if isinstance(n, kinds)]
    return sum(len(d) for d in docs if d)


def imported(tree, root):
    """The repository files that tree's imports name."""
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            path = os.path.join(root, *name.split(".")) + ".py"
            if os.path.isfile(path):
                yield path


def main(root):
    seen = {}
    todo = [os.path.join(root, "train.py"), os.path.join(root, "sample.py")]
    while todo:
        path = todo.pop()
        if path not in seen:
            source = open(path).read()
            tree = ast.parse(source)
            seen[path] = (tokens(source), docstring_chars(tree), len(source))
            todo.extend(imported(tree, root))
    total = [0, 0, 0]
    for path, counts in sorted(seen.items(), key=lambda item: -item[1][0]):
        total = [a + b for a, b in zip(total, counts)]
        share = counts[1] / max(counts[2], 1)
        print(f"{os.path.relpath(path, root):22s} {counts[0]:6,d}  docstrings {share:.1%}")
    print(f"{'the core':22s} {total[0]:6,d}  docstrings {total[1] / total[2]:.1%}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(__file__)) or ".")
