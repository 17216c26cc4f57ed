"""Generate helm/sparring/README.md (helm-docs style) from the `# --` comments in values.yaml.

    python helm/sparring/hack/gen_readme.py          # rewrite README.md
    python helm/sparring/hack/gen_readme.py --check  # exit 1 if README.md is stale

A key is documented by a `# -- text` comment on the line(s) right above it; a documented map
(e.g. `resources`) is one row, its children are not listed separately.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[1]
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?:\s|$)")


def documented_keys(text: str) -> dict[str, str]:
    """{dotted key: description} for every key with a `# --` comment above it."""
    docs: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        if pending and stripped.startswith("#") and not stripped.startswith("# --"):
            pending.append(stripped[1:].strip())
            continue
        m = KEY.match(line)
        if not m or stripped.startswith("-"):
            if stripped and not stripped.startswith("#"):
                pending = []
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m["key"]))
        path = ".".join(k for _, k in stack)
        if pending:
            docs[path] = " ".join(pending)
        pending = []
    return docs


def leaf_paths(values: object, prefix: str = "") -> list[str]:
    """Dotted paths of every leaf (a scalar, a list, or an empty map) in the values."""
    if isinstance(values, dict) and values:
        out: list[str] = []
        for key, value in values.items():
            out += leaf_paths(value, f"{prefix}.{key}" if prefix else str(key))
        return out
    return [prefix]


def undocumented(text: str) -> list[str]:
    """Leaf paths with no `# --` comment on themselves or on any parent map."""
    docs = documented_keys(text)
    values = yaml.safe_load(text)

    def covered(path: str) -> bool:
        parts = path.split(".")
        return any(".".join(parts[:i]) in docs for i in range(1, len(parts) + 1))

    return [p for p in leaf_paths(values) if not covered(p)]


def _lookup(values: dict, path: str) -> object:
    for part in path.split("."):
        values = values[part]
    return values


def _type(value: object) -> str:
    return {
        bool: "bool",
        int: "int",
        float: "float",
        str: "string",
        list: "list",
        dict: "object",
    }.get(type(value), "string")


def render(text: str) -> str:
    """The README: chart summary plus one table row per documented key, in file order."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load(text)
    rows = []
    for path, desc in documented_keys(text).items():
        value = _lookup(values, path)
        default = json.dumps(value)
        desc = desc.replace("|", "\\|")
        rows.append(f"| {path} | {_type(value)} | `{default}` | {desc} |")
    return "\n".join(
        [
            f"# {chart['name']}",
            "",
            f"![Version: {chart['version']}](https://img.shields.io/badge/Version-{chart['version']}-informational?style=flat-square) "
            f"![AppVersion: {chart['appVersion']}](https://img.shields.io/badge/AppVersion-{chart['appVersion']}-informational?style=flat-square)",
            "",
            " ".join(chart["description"].split()),
            "",
            "Generated from the `# --` comments in `values.yaml` by `hack/gen_readme.py`; do not edit.",
            "The install walkthrough (standalone and multi-user KFP) is docs/cluster.md;",
            "what could be checked without a cluster is listed there too.",
            "",
            "## Values",
            "",
            "| Key | Type | Default | Description |",
            "|-----|------|---------|-------------|",
            *rows,
            "",
        ]
    )


def main(argv: list[str]) -> int:
    text = (CHART / "values.yaml").read_text()
    missing = undocumented(text)
    if missing:
        print("values keys without a `# --` comment: " + ", ".join(missing), file=sys.stderr)
        return 1
    readme = CHART / "README.md"
    new = render(text)
    if "--check" in argv:
        if readme.read_text() != new:
            print(
                f"{readme} is stale: run python {Path(__file__).relative_to(Path.cwd())}",
                file=sys.stderr,
            )
            return 1
        return 0
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
