"""Every command README.md and the docs/ pages show names a script that exists and flags that
script takes, so a renamed flag fails here (bench/readme.py runs the commands themselves); run in
order, no training overwrites another's folder; the scripts' examples load the README's models."""

import argparse
import ast
import glob
import os
import re
import runpy
import shlex

import pytest
from conftest import ROOT

import rl
import train
from bench.readme import PAGES, page_blocks
from export import GGUF_LAYOUT
from lib.settings import parse

# a command starts at python or torchrun and ends where the shell or the markdown takes over
COMMAND = re.compile(r"\b(python|torchrun)\s([^`|;#\n]+)")
SEPARATOR = re.compile(r"&&|\\$")


def page_commands():
    """(page, python or torchrun, its words) of every command in the pages, in order."""
    found = []
    for page in PAGES:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            text = f.read().replace("# offline:", "")  # the flags a line takes offline are its own
        for match in COMMAND.finditer(text):
            words = shlex.split(SEPARATOR.split(match.group(2))[0])
            found.append((page, match.group(1), words))
    return found


def readme_commands():
    """(script, [its --flags]) of every python or torchrun command in the pages, in order."""
    return [found for _, _, words in page_commands() for found in script_flags(words)]


def script_flags(words):
    """[(script, [its --flags])] of one command's words; after a bare --, the command that
    bench/core_tokens.py runs, a command of its own."""
    inner = []
    if "--" in words:
        cut = words.index("--")
        words, inner = words[:cut], words[cut + 1 :]
    scripts = [i for i, word in enumerate(words) if word.endswith(".py")]
    found = []
    if scripts:  # python -m pytest names none
        first = scripts[0]
        flags = [w.partition("=")[0] for w in words[first + 1 :] if w.startswith("--")]
        found.append((words[first], flags))
    return found + (script_flags(inner) if inner else [])


def test_the_pages_are_the_readme_and_every_docs_page():
    """A page added to docs/ is walked and checked too, not left to go stale."""
    pages = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))}
    assert PAGES[0] == "README.md"
    assert sorted(PAGES[1:]) == sorted(pages)


def test_what_is_where_names_each_module_once():
    """README.md's "What is where" has one row for each module of the root, lib/ and
    serving/, and none for a module that is not there."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        table = f.read().split("## What is where")[1].split("\n## ")[0]
    rows = re.findall(r"^\| `([\w/]+\.py)` \|", table, re.MULTILINE)
    modules = []
    for folder in ("", "lib", "serving"):
        for name in os.listdir(os.path.join(ROOT, folder or ".")):
            if name.endswith(".py") and name != "__init__.py":
                modules.append(os.path.join(folder, name))
    assert sorted(rows) == sorted(modules)


def test_requests_to_the_server_follow_serve_py_on_its_page():
    """bench/readme.py stops serve.py at the end of its page: a request before it, or on another
    page, would find no server."""
    serving = None
    for page, _, lines in page_blocks():
        for line in lines:
            if "serve.py" in line:
                serving = page
            elif ":8000" in line:
                assert serving == page, f"{page} asks a server it has not started: {line[:60]}"


class Parsed(BaseException):
    """Raised by argparse's parse in place of parsing: the parser a script built (past the
    scripts' `except Exception`)."""


def accepted_flags(script):
    """The --flags script takes: train.py's keys, or the options of the parser it builds when run
    (caught as it parses)."""
    if script in ("train.py", "rl.py"):  # settings.parse's options
        options = train.OPTIONS if script == "train.py" else rl.OPTIONS
        return {f"--{name}" for name in options} | {"--help", "--print_config"}

    def capture(parser, *args, **kwargs):
        raise Parsed(parser)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
        with pytest.raises(Parsed) as parsed:
            runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
    return set(parsed.value.args[0]._option_string_actions)


def test_the_readme_shows_commands_of_every_kind():
    """The extraction finds what the README holds: a test that would pass on nothing fails."""
    scripts = {script for script, _ in readme_commands()}
    assert {"train.py", "sample.py", "serve.py", "classify.py", "export.py", "plot.py"} <= scripts
    assert ("sample.py", ["--out_dir", "--start"]) in readme_commands()
    assert ("export.py", ["--out_dir", "--hf_dir"]) in readme_commands()  # a docs/ page's


@pytest.mark.parametrize("script", sorted({script for script, _ in readme_commands()}))
def test_every_readme_command_names_a_script_and_flags_it_takes(script):
    assert os.path.isfile(os.path.join(ROOT, script)), f"the pages run {script}, which is gone"
    flags = {flag for name, given in readme_commands() if name == script for flag in given}
    unknown = flags - accepted_flags(script)
    assert not unknown, f"the pages give {script} flags it does not take: {sorted(unknown)}"


def trained(words):
    """The settings of a command's training, as train.py reads its config files and overrides
    (bench/core_tokens.py's after its --), or None where it trains nothing."""
    words = words[words.index("--") + 1 :] if "--" in words else words
    if "train.py" not in words or {"--help", "--print_config"} & set(words):
        return None
    args = words[words.index("train.py") + 1 :]
    paths = [a if a.startswith("--") else os.path.join(ROOT, a) for a in args]
    return parse(paths, train.OPTIONS, "")[0]


def test_no_training_of_the_pages_overwrites_another_ones_folder():
    """Run in order, each train.py command writes an out_dir of its own, or resumes its own, or
    is one shown before (torchrun's, one run's forms on several GPUs, aside)."""
    written = {}
    for page, launcher, words in page_commands():
        settings = trained(words)
        if launcher == "torchrun" or settings is None or settings.init_from == "resume":
            continue
        page_before, words_before = written.setdefault(settings.out_dir, (page, words))
        assert words_before == words, (
            f"{page}'s {shlex.join(words)} writes {settings.out_dir}, which {page_before}'s "
            f"{shlex.join(words_before)} made: give it an --out_dir of its own"
        )


def test_the_scripts_examples_load_the_readmes_models():
    """The checkpoints the --help examples of the README's scripts load are the README's."""
    readme = [trained(words) for page, _, words in page_commands() if page == "README.md"]
    made = {settings.out_dir for settings in readme if settings}
    assert made == {"out-agnews", "out-shakespeare-char-cpu", "out-chat"}
    for script in ("train.py", "sample.py", "classify.py", "serve.py"):
        with open(os.path.join(ROOT, script), encoding="utf-8") as f:
            doc = ast.get_docstring(ast.parse(f.read()))
        named = set(re.findall(r"--out_dir[= ](\S+)", doc))
        assert named <= made, f"{script} --help loads {sorted(named - made)}, not a README model"


def test_the_readme_gives_its_offline_flags_in_the_commands():
    """An offline reader copies the quick start's commands as they are: no flag waits in an
    `# offline:` comment, which a copy of the command leaves behind."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert "# offline:" not in f.read()


def test_the_pages_gguf_export_is_of_a_model_llama_cpp_runs():
    """The pages' GGUF export reads a model that a page trains before it, in the form llama.cpp's
    gpt2 takes (a fine-tune's is its start's): the README's gelu=none model is refused there."""
    made, exported = {}, []
    for _, _, words in page_commands():
        settings = trained(words)
        if settings:
            made[settings.out_dir] = made.get(settings.init_from, settings)
        if "export.py" in words and any(w.startswith("--gguf=") for w in words):
            exported += [w.partition("=")[2] for w in words if w.startswith("--out_dir=")]
    assert exported, "the pages show no GGUF export"
    for out_dir in exported:
        assert out_dir in made, f"the pages export {out_dir} to GGUF, which no page trains"
        held = {k: getattr(made[out_dir], k) for k in GGUF_LAYOUT}
        assert held == GGUF_LAYOUT, out_dir
