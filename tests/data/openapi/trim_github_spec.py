"""Rebuild github-api-subset.json from GitHub's published OpenAPI description.

Usage: python tests/data/openapi/trim_github_spec.py path/to/api.github.com.json

It also writes plugins/openapi/examples/github-public.json, the handful of public,
read-only endpoints that the example configuration serves.

The source is `generated/api.github.com.json` of the npm package @octokit/openapi
(MIT, see README.md here). This keeps the operations of a few tags plus the release,
branch, content, commit, fork and topic endpoints of `repos`, drops the response
examples (most of the file's size), and keeps only the components those operations
reach through `$ref`, so the result is a valid, self-contained OpenAPI document.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

TAGS = {
    "issues", "pulls", "users", "gists", "activity", "reactions", "git", "checks", "search", "meta",
    "licenses", "markdown", "emojis", "rate-limit", "gitignore", "codes-of-conduct", "teams",
}  # fmt: skip
REPOS_PATH_WORDS = ("/releases", "/branches", "/contents", "/commits", "/forks", "/topics", "/readme")
METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
EXAMPLE_TAGS = {"meta", "licenses", "emojis", "gitignore", "rate-limit", "codes-of-conduct", "markdown"}
OUT = Path(__file__).with_name("github-api-subset.json")
EXAMPLE = Path(__file__).resolve().parents[3] / "plugins" / "openapi" / "examples" / "github-public.json"


def _keep(path: str, operation: dict[str, Any], tags: set[str], repos: bool) -> bool:
    tag = (operation.get("tags") or [""])[0]
    return tag in tags or (repos and tag == "repos" and any(word in path for word in REPOS_PATH_WORDS))


def _strip_examples(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_examples(v) for k, v in node.items() if k not in ("examples", "example", "x-github")}
    if isinstance(node, list):
        return [_strip_examples(v) for v in node]
    return node


def _refs(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            found.add(ref)
        for value in node.values():
            found |= _refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= _refs(value)
    return found


def write_subset(spec: dict[str, Any], out: Path, tags: set[str], repos: bool, description: str) -> None:
    paths: dict[str, Any] = {}
    for path, item in spec["paths"].items():
        kept = {m: op for m, op in item.items() if m in METHODS and _keep(path, op, tags, repos)}
        if kept:
            shared = {k: v for k, v in item.items() if k not in METHODS}
            paths[path] = _strip_examples(shared | kept)
    components = _strip_examples(spec["components"])
    used: dict[str, dict[str, Any]] = {}
    pending = _refs(paths)
    while pending:
        ref = pending.pop()
        _, _, section, name = ref.split("/", 3)
        if name in used.setdefault(section, {}):
            continue
        used[section][name] = components[section][name]
        pending |= _refs(components[section][name])
    document = {
        "openapi": spec["openapi"],
        "info": spec["info"] | {"description": description},
        "servers": spec["servers"],
        "tags": [t for t in spec.get("tags", []) if t["name"] in tags | ({"repos"} if repos else set())],
        "paths": paths,
        "components": {section: dict(sorted(items.items())) for section, items in sorted(used.items())},
    }
    readable = out == EXAMPLE  # the example is small and meant to be read
    out.write_text(
        json.dumps(document, indent=1 if readable else None, separators=None if readable else (",", ":")) + "\n"
    )
    operations = sum(1 for item in paths.values() for m in item if m in METHODS)
    print(f"{out.name}: {operations} operations, {out.stat().st_size} bytes")


def main(source: Path) -> None:
    spec = json.loads(source.read_text())
    write_subset(spec, OUT, TAGS, True, "A subset of GitHub's REST API, for tests.")
    write_subset(spec, EXAMPLE, EXAMPLE_TAGS, False, "Public, read-only endpoints of GitHub's REST API.")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
