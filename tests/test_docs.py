"""The README and docs/*.md name only what exists, and their configs and commands are valid.

1. Paths: every repository path they name (`sparring/loop/runner.py`, `tests/x.py::test_y`,
   `docs/results.md#an-entry`) exists, with the named function or heading; every relative
   link and anchor resolves; every bare `test_*` name and `pytest -k word` matches a test.
   The comment headers of configs/*.yaml are checked the same way.
2. Code names: every dotted `sparring.*` name imports (the longest importable module, then
   getattr the rest; `sparring.components`, `.pipelines` and `.configs` as installed), unless
   it is a string the package itself uses (an MLflow tag such as `sparring.run`); so does
   every `from sparring... import` in a python block, and every attribute it then reads of an
   imported sparring module.
3. YAML: every ```yaml block validates as a `PipelineConfig` (its `train` and
   `warm_start.train` sections too), or as the class that a `# class: <dotted name>` line in
   the block names; with `# over: <config file>` the block is merged over that file first.
   Duplicate keys fail.
4. Flags: every option of a `sparring <command>` or `bench/<name>.py` command they show is
   one that command's --help lists (click's options; the bench's `add_argument` calls, read
   from its source so that no bench imports torch here).

A code block that contains `git checkout <commit>` shows commands of that older tree: its paths
and bench flags are checked against that commit (skipped where the clone lacks it).
"""

from __future__ import annotations

import ast
import importlib
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
TOP_DIRS = ("sparring", "bench", "configs", "tests", "components", "pipelines", "images", "helm")
PATH_RE = re.compile(
    rf"(?<![\w./@:-])((?:{'|'.join(TOP_DIRS)}|docs|\.ci)/[\w.@/-]*)(::[\w:]+|#[\w-]+)?"
)
DOTTED_RE = re.compile(r"(?<![\w./-])sparring(?:\.\w+)+")
FENCE_RE = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^\1```", re.M | re.S)
SPAN_RE = re.compile(r"`([^`]+)`")
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
CHECKOUT_RE = re.compile(r"git checkout ([0-9a-f]{7,40})\b")
SHELL_LANGS = {"", "bash", "sh", "shell", "console", "text"}


@dataclass
class Block:
    lang: str
    body: str
    line: int
    commit: str | None = None  # `git checkout <commit>` inside: an older tree's commands


@dataclass
class Doc:
    path: Path
    text: str
    blocks: list[Block] = field(default_factory=list)
    spans: list[tuple[str, int]] = field(default_factory=list)
    prose: str = ""  # the text with code blocks blanked out (line numbers kept)
    current: str = ""  # the text with older trees' blocks blanked out

    def where(self, line: int) -> str:
        return f"{self.path.relative_to(ROOT)}:{line}"


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


@cache
def parse(path: Path) -> Doc:
    """Fenced blocks (dedented), inline code spans, and the prose around them."""
    text = path.read_text()
    if path.suffix == ".yaml":  # a config: only its comment lines are prose
        comments = [ln if ln.lstrip().startswith("#") else "" for ln in text.splitlines()]
        text = "\n".join(comments)
    doc = Doc(path, text)
    prose = current = text
    for m in FENCE_RE.finditer(text):
        body = textwrap.dedent(m.group(3))
        commit = CHECKOUT_RE.search(body)
        doc.blocks.append(
            Block(m.group(2).lower(), body, line_of(text, m.start(3)), commit and commit[1])
        )
        blank = re.sub(r"[^\n]", " ", m.group(0))
        prose = prose[: m.start()] + blank + prose[m.end() :]
        if commit:
            current = current[: m.start()] + blank + current[m.end() :]
    doc.prose, doc.current = prose, current
    for m in SPAN_RE.finditer(prose):
        if "\n\n" not in m.group(1):
            doc.spans.append((" ".join(m.group(1).split()), line_of(prose, m.start())))
    return doc


def all_docs() -> list[Doc]:
    return [parse(p) for p in DOCS]


def commands(text: str) -> list[str]:
    """Shell commands in `text`: continuation lines joined, comments dropped, split at
    `|`, `||`, `&&` and `;`."""
    text = text.replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        line = re.sub(r"(^|\s)#.*", "", line)
        found.extend(part for part in re.split(r"\s(?:\|\|?|&&|;)\s", line) if part.strip())
    return found


def shown_commands(doc: Doc):
    """(command, where, commit) for every command in a shell block or an inline code span."""
    for block in doc.blocks:
        if block.lang in SHELL_LANGS:
            for command in commands(block.body):
                yield command, doc.where(block.line), block.commit
    for span, line in doc.spans:
        for command in commands(span):
            yield command, doc.where(line), None


# ---------------------------------------------------------------- 1. paths, links, anchors


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for line in parse(path).prose.splitlines():
        m = re.match(r"#{1,6} +(.+?) *#*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(f"{base}-{n}" if n else base)
    return found


@cache
def tree_has(commit: str, rel: str) -> bool | None:
    """Whether `rel` exists at `commit` (None: the clone lacks the commit)."""

    def git_has(obj: str) -> bool:
        return (
            subprocess.run(["git", "cat-file", "-e", obj], cwd=ROOT, capture_output=True).returncode
            == 0
        )

    try:
        if not git_has(f"{commit}^{{commit}}"):
            return None  # a shallow clone, or no git history at all
    except FileNotFoundError:  # no git
        return None
    return git_has(f"{commit}:{rel.rstrip('/')}")


def defines(path: Path, name: str) -> bool:
    return re.search(rf"^\s*(async\s+)?(def|class)\s+{name}\b", path.read_text(), re.M) is not None


TEST_DEF = re.compile(r"^\s*(?:async\s+)?def\s+(test_\w+)", re.M)


@cache
def defined_test_names() -> set[str]:
    return {n for f in (ROOT / "tests").rglob("*.py") for n in TEST_DEF.findall(f.read_text())}


def path_problem(rel: str, suffix: str, commit: str | None) -> str | None:
    """What is wrong with a named path (and its ::name or #anchor), or None."""
    if commit:  # a command of an older tree
        return f"{rel} is not in the tree at {commit}" if tree_has(commit, rel) is False else None
    target = ROOT / rel
    if not target.exists():
        return f"{rel} does not exist"
    if suffix.startswith("::") and target.is_file() and not defines(target, suffix.split("::")[-1]):
        return f"{rel} defines no {suffix.split('::')[-1]}"
    if suffix.startswith("#") and target.suffix == ".md" and suffix[1:] not in anchors(target):
        return f"{rel} has no heading {suffix}"
    return None


def named_paths(text: str):
    for m in PATH_RE.finditer(text):
        end = m.end(1)
        if end < len(text) and text[end] in "<*{":  # a pattern: requirements-<flavour>.lock
            continue
        yield m.group(1).rstrip("."), m.group(2) or "", line_of(text, m.start())


def path_problems(doc: Doc) -> list[str]:
    problems = []
    for rel, suffix, line in named_paths(doc.current):
        if problem := path_problem(rel, suffix, None):
            problems.append(f"{doc.where(line)}: {problem}")
    for block in doc.blocks:
        if block.commit:
            for rel, suffix, line in named_paths(block.body):
                if problem := path_problem(rel, suffix, block.commit):
                    problems.append(f"{doc.where(block.line + line - 1)}: {problem}")
    for m in LINK_RE.finditer(doc.prose):
        link = m.group(1)
        if re.match(r"[a-z]+:", link):
            continue
        file, _, anchor = link.partition("#")
        target = (doc.path.parent / file).resolve() if file else doc.path
        where = doc.where(line_of(doc.prose, m.start()))
        if not target.exists():
            problems.append(f"{where}: link {link}: {file} does not exist")
        elif anchor and anchor not in anchors(target):
            problems.append(f"{where}: link {link}: no heading #{anchor} in {target.name}")
    for span, line in doc.spans:
        if re.fullmatch(r"test_\w+", span) and span not in defined_test_names():
            problems.append(f"{doc.where(line)}: no test is named {span}")
    for command, where, commit in shown_commands(doc):
        m = re.search(r"pytest .*?((?:tests/\S+\.py\s*)+).*\s-k (\w+)$", command.strip())
        if m and not commit:
            files = [ROOT / f for f in m.group(1).split()]
            names = [n for f in files if f.exists() for n in TEST_DEF.findall(f.read_text())]
            if not any(m.group(2) in n for n in names):
                problems.append(f"{where}: -k {m.group(2)} selects no test in {m.group(1).strip()}")
    return problems


def test_named_paths_links_and_tests_exist():
    problems = [p for doc in all_docs() + [parse(c) for c in CONFIGS] for p in path_problems(doc)]
    assert not problems, "stale references:\n" + "\n".join(problems)


# ---------------------------------------------------------------- 2. sparring.* names


@cache
def package_strings() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "sparring").rglob("*.py"))


def resolve(dotted: str) -> object:
    """Import the longest importable prefix of `dotted`, then getattr the rest."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and not name.startswith(e.name) and e.name != name:
                raise  # the module exists but needs something missing
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def name_problems(doc: Doc) -> list[str]:
    problems = []
    for m in DOTTED_RE.finditer(doc.current):
        name = m.group(0)
        try:
            resolve(name)
        except (ImportError, AttributeError) as e:
            if f'"{name}"' not in package_strings():
                problems.append(f"{doc.where(line_of(doc.current, m.start()))}: {name}: {e}")
    for block in doc.blocks:
        if block.lang != "python" or block.commit:
            continue
        modules: dict[str, str] = {}  # local name -> sparring module it is bound to
        for node in ast.walk(ast.parse(block.body)):
            names = []
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sparring"):
                names = [(f"{node.module}.{a.name}", a.asname or a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                names = [(a.name, a.asname or a.name) for a in node.names]
            for full, local in names:
                if not full.startswith("sparring"):
                    continue
                try:
                    obj = resolve(full)
                except (ImportError, AttributeError) as e:
                    problems.append(f"{doc.where(block.line)}: {full}: {e}")
                    continue
                if type(obj).__name__ == "module":
                    modules[local] = full
        for node in ast.walk(ast.parse(block.body)):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
            ):
                full = f"{modules[node.value.id]}.{node.attr}"
                try:
                    resolve(full)
                except (ImportError, AttributeError) as e:
                    problems.append(f"{doc.where(block.line)}: {full}: {e}")
    return problems


def test_named_sparring_code_exists():
    problems = [p for doc in all_docs() + [parse(c) for c in CONFIGS] for p in name_problems(doc)]
    assert not problems, "stale code names:\n" + "\n".join(problems)


# ---------------------------------------------------------------- 3. YAML snippets


class _UniqueKeys(yaml.SafeLoader):
    """A loader that refuses a mapping with a repeated key (PyYAML keeps the last)."""


def _mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict:
    keys = [loader.construct_object(k, deep=True) for k, _ in node.value]
    repeated = {k for k in keys if keys.count(k) > 1}
    if repeated:
        raise yaml.constructor.ConstructorError(
            None, None, f"repeated keys {repeated}", node.start_mark
        )
    return loader.construct_mapping(node, deep=True)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = merged(base[key], value) if both else value
    return out


def validate(block: Block) -> None:
    from sparring.loop.config import PipelineConfig

    data = yaml.load(block.body, Loader=_UniqueKeys)  # noqa: S506 - a SafeLoader
    over = re.search(r"^# over: (\S+)", block.body, re.M)
    if over:
        data = merged(yaml.safe_load((ROOT / over[1]).read_text()), data)
    named = re.search(r"^# class: (\S+)", block.body, re.M)
    cls = resolve(named[1]) if named else PipelineConfig
    cls.model_validate(data)


def yaml_blocks() -> list[tuple[str, Block]]:
    return [
        (doc.where(b.line), b)
        for doc in all_docs()
        for b in doc.blocks
        if b.lang in ("yaml", "yml")
    ]


@pytest.mark.parametrize("where,block", yaml_blocks(), ids=[w for w, _ in yaml_blocks()])
def test_yaml_snippet_validates(where, block):
    validate(block)


def test_yaml_check_refuses_a_bad_snippet():
    """The YAML check can fail: a wrong key, a repeated key, a bad base file."""
    for body in (
        "train: {group_kee: init}\n",
        "game: {name: matching}\ngame: {name: diplomacy}\n",
        "# over: configs/pipeline-gpu.yaml\nrollout: {backend: {name: nope}}\n",
    ):
        with pytest.raises(Exception):  # noqa: B017 - pydantic's or yaml's error
            validate(Block("yaml", body, 1))


# ---------------------------------------------------------------- 4. command-line flags


@cache
def cli_commands() -> dict[tuple[str, ...], tuple[set[str], bool]]:
    """(sub)command path -> (the options its --help lists, whether it has subcommands)."""
    import click

    from sparring.cli import main

    found: dict[tuple[str, ...], tuple[set[str], bool]] = {}

    def walk(cmd: click.Command, path: tuple[str, ...]) -> None:
        opts = {"--help", "-h"}
        for p in cmd.params:
            opts.update(p.opts + p.secondary_opts)
        subcommands = getattr(cmd, "commands", {})
        found[path] = (opts, bool(subcommands))
        for name, sub in subcommands.items():
            walk(sub, (*path, name))

    walk(main, ())
    return found


def argparse_flags(source: str) -> set[str] | None:
    """The option strings of every `add_argument` call (None: one is not a literal)."""
    flags = {"--help", "-h"}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
            continue
        for arg in node.args:
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                return None
            if arg.value.startswith("-"):
                flags.add(arg.value)
                negatable = any(
                    k.arg == "action" and getattr(k.value, "attr", "") == "BooleanOptionalAction"
                    for k in node.keywords
                )
                if negatable:
                    flags.add("--no-" + arg.value.lstrip("-"))
    return flags


@cache
def bench_flags(script: str, commit: str | None) -> set[str] | None:
    """The options of bench/<script> (at `commit`, or in this tree); None: not checkable."""
    if commit:
        if tree_has(commit, script) is None:
            return None
        shown = subprocess.run(
            ["git", "show", f"{commit}:{script}"], cwd=ROOT, capture_output=True, text=True
        )
        return argparse_flags(shown.stdout) if shown.returncode == 0 else set()
    path = ROOT / script
    if not path.exists():
        return set()
    flags = argparse_flags(path.read_text())
    if flags is None:  # built at run time: ask the script itself
        out = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True)
        flags = set(re.findall(r"^\s+(?:-\w+, )?(--[\w-]+)", out.stdout, re.M)) | {"-h"}
    return flags


def tokens(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


WRAPPER = r"time|/usr/bin/time|nice|env|-\w|\w+=\S*"  # what may come before a command


def flag_problems(command: str, commit: str | None) -> list[str]:
    words = tokens(command)
    for i, word in enumerate(words):
        wrapped = all(re.fullmatch(WRAPPER, w) for w in words[:i])  # `time -v sparring ...`
        if re.fullmatch(r"(\S*/)?sparring", word) and wrapped:
            path, rest = (), words[i + 1 :]
            while rest and (*path, rest[0]) in cli_commands():
                path, rest = (*path, rest[0]), rest[1:]
            known, group = cli_commands()[path]
            label = " ".join(("sparring", *path))
            if commit or (rest and re.search(r"[<|]", rest[0])):  # an old tree or a pattern
                return []
            if group and rest and re.fullmatch(r"[a-z][\w-]*", rest[0]):
                return [f"`{label} {rest[0]}` is not a command"]
        elif m := re.search(r"(?:^|/)(bench/\w+\.py)$", word):
            rest, label = words[i + 1 :], m[1]
            known = bench_flags(m[1], commit)
            if known is None:
                return []
            if not known:
                return [f"{m[1]} does not exist" + (f" at {commit}" if commit else "")]
        else:
            continue
        flags = [w.split("=")[0] for w in rest if re.match(r"--?[a-zA-Z]", w)]
        return [f"{label} has no {f}" for f in flags if f not in known]
    return []


def test_shown_flags_exist():
    problems = [
        f"{where}: {problem}"
        for doc in all_docs()
        for command, where, commit in shown_commands(doc)
        for problem in flag_problems(command, commit)
    ]
    assert not problems, "flags no command has:\n" + "\n".join(problems)


def test_flag_check_refuses_stale_flags():
    """The flag check can fail: the old learning bench's --model, a made-up sparring flag."""
    assert flag_problems(".venv/bin/python bench/learning.py --model x --set a=1", None) == [
        "bench/learning.py has no --model"
    ]
    assert flag_problems("sparring run --config c.yaml --kfp --nope", None) == [
        "sparring run has no --nope"
    ]
    assert flag_problems("sparring runn", None) == ["`sparring runn` is not a command"]
    assert flag_problems("sparring model fecth x", None) == [
        "`sparring model fecth` is not a command"
    ]
    assert flag_problems("sparring model fetch smollm2-135m-instruct", None) == []
