"""Every hook has a documented signature in docs/plugins.md and a test that exercises it."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from gateway import hookspecs

REPO = Path(__file__).resolve().parent.parent


def _hooks() -> list[str]:
    return [name for name, _ in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("gateway_")]


def test_there_is_at_least_one_hook() -> None:
    assert "gateway_register_servers" in _hooks()


def test_every_hook_has_a_section_with_its_exact_signature_in_the_plugin_guide() -> None:
    guide = (REPO / "docs" / "plugins.md").read_text()
    for name in _hooks():
        function = getattr(hookspecs, name)
        signature = str(inspect.signature(function)).replace("'", "")
        assert f"### {name}\n" in guide, f"docs/plugins.md has no section for {name}"
        assert f"def {name}{signature}" in guide, f"docs/plugins.md does not show {name}{signature}"


def test_every_hook_is_exercised_by_a_test() -> None:
    tests = "\n".join(p.read_text() for p in (REPO / "tests").rglob("*.py") if p.name != "test_docs.py")
    for name in _hooks():
        assert f"def {name}(" in tests, f"no test plugin implements {name}"


def test_the_complete_plugin_in_the_guide_works_when_pasted_into_plugins(tmp_path: Path) -> None:
    import anyio

    from gateway.config.runtime_settings import PluginSettings
    from gateway.config.settings import Settings
    from tests.conftest import call_plugin_tool

    guide = (REPO / "docs" / "plugins.md").read_text()
    section = guide[guide.index("## A complete plugin") :]
    start = section.index("```python\n") + len("```python\n")
    code = section[start : section.index("```\n", start)]
    (tmp_path / "plugins" / "weather").mkdir(parents=True)
    (tmp_path / "plugins" / "weather" / "__init__.py").write_text(code)
    settings = Settings(
        data_dir=tmp_path / "data", plugins=PluginSettings(directory=tmp_path / "plugins", entry_points=False)
    )

    result = anyio.run(call_plugin_tool, settings, "weather__forecast", {"city": "Lyon"})
    assert result.content[0].text == "Sunny in Lyon."  # type: ignore[union-attr]


def test_every_local_url_of_the_endpoint_or_the_console_in_the_docs_names_the_default_port() -> None:
    from gateway.config.runtime_settings import HttpSettings

    default = HttpSettings().port
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    found = 0
    for page in pages:
        for port, path in re.findall(r"(?:127\.0\.0\.1|localhost):(\d+)(/mcp|/admin)\b", page.read_text()):
            found += 1
            assert int(port) == default, f"{page.name} names port {port} for {path}; the default is {default}"
    assert found, "no local URL of /mcp or /admin found in the docs"


def _anchors(markdown: str) -> set[str]:
    """The anchors a page offers: its headings as GitHub makes them, and its `<a id="...">` tags."""
    headings = re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE)
    slugs = {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}
    return slugs | set(re.findall(r'<a id="([^"]+)"></a>', markdown))


def test_every_link_into_the_benchmarks_page_finds_its_section() -> None:
    anchors = _anchors((REPO / "docs" / "benchmarks.md").read_text())
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for page in pages:
        for anchor in re.findall(r"benchmarks\.md#([\w-]+)", page.read_text()):
            assert anchor in anchors, f"{page.name} links to benchmarks.md#{anchor}, which is not there"


def test_every_section_of_the_benchmarks_page_names_the_command_behind_its_figures() -> None:
    page = (REPO / "docs" / "benchmarks.md").read_text()
    sections = page.split("\n## ")[1:]
    assert sections
    for section in sections:
        title = section.splitlines()[0]
        assert re.search(r"bench/\w+\.py|mcp-gateway \w+|\.ci/run", section), f"## {title} names no command"


def test_the_readme_indexes_every_page_of_the_docs() -> None:
    readme = (REPO / "README.md").read_text()
    index = readme.split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    for page in sorted((REPO / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in index, f"the README's documentation index does not link docs/{page.name}"
