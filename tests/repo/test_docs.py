"""The README and the documentation site: the site builds with `mkdocs build --strict` (broken links
and anchors fail it), its generated pages follow the code, the README's links resolve and its
commands are the ones CI and the other pages run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli import env_name
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")
SERVE_COMMAND = "pip install '.[serve-cpu]' && disan serve"
FRONT_PAGE_LINES = 250  # the README is the front page; everything longer belongs in docs/


def github_anchor(heading: str) -> str:
    """The anchor GitHub (and mkdocs' toc) gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(markdown: Path) -> set[str]:
    text = markdown.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # `# comments` in code are no headings
    return {github_anchor(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_readme_links_resolve() -> None:
    broken = []
    for target in LINK.findall(README.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else README
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"README links to nothing: {broken}"


def test_readme_is_a_front_page() -> None:
    """Short, with how to install and run the service in its first screenful."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= FRONT_PAGE_LINES, f"README has {len(lines)} lines; move details to docs/"
    assert any(SERVE_COMMAND in line for line in lines[:30]), "the serve command left the first screen"


def fenced_lines(text: str) -> list[str]:
    return [line for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)
            for line in block.splitlines()]


def test_readme_test_command_is_what_ci_runs() -> None:
    """.ci/run installs the extras of the README's test command and runs the same pytest."""
    readme = [line for line in fenced_lines(README.read_text(encoding="utf-8")) if "python -m pytest" in line]
    assert len(readme) == 1, readme
    command = readme[0]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    extras = re.search(r"pip install -e '\.\[([\w,-]+)\]'", command).group(1)
    ci_extras = re.search(r"pip install -q -e '\.\[([\w,-]+)\]'", ci).group(1)
    assert set(extras.split(",")) == set(ci_extras.split(",")), (command, ci_extras)
    torch_pin = re.search(r"torch==[\d.]+", command).group(0)
    assert re.search(rf"pip install -q {re.escape(torch_pin)}\n", ci), f"CI does not install {torch_pin}"
    assert re.search(r"^python -m pytest$", ci, flags=re.M), "CI does not run the README's pytest"
    # The pages that repeat it repeat it exactly.
    for page in ("getting-started.md", "development.md"):
        copies = [line for line in fenced_lines((ROOT / "docs" / page).read_text(encoding="utf-8"))
                  if "python -m pytest" in line]
        assert copies == [command], f"docs/{page}: {copies}"


def test_serve_command_is_the_same_everywhere() -> None:
    for page in (README, ROOT / "docs" / "getting-started.md"):
        assert SERVE_COMMAND in fenced_lines(page.read_text(encoding="utf-8")), page.name


def test_site_builds_strict(tmp_path: Path) -> None:
    """`mkdocs build --strict`: every internal link and anchor resolves, every page is in the
    navigation; the generated pages list every setting and every route of the code."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    pytest.importorskip("material", reason="the docs extra is not installed (pip install -e '.[docs]')")
    site = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISAN_")}
    env["NO_MKDOCS_2_WARNING"] = "1"  # mkdocs-material's banner about MkDocs 2, printed on every build
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                             str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    settings_page = (site / "configuration" / "index.html").read_text(encoding="utf-8")
    missing = [env_name(name) for name in Settings.model_fields if env_name(name) not in settings_page]
    assert not missing, f"settings missing from the configuration page: {missing}"
    schema = json.loads((site / "openapi.json").read_text(encoding="utf-8"))
    reference = (site / "api-reference" / "index.html").read_text(encoding="utf-8")
    assert "/v1/embeddings" in schema["paths"]
    missing_routes = [path for path in schema["paths"] if f"{path}</code>" not in reference]
    assert not missing_routes, f"routes missing from the OpenAPI reference: {missing_routes}"
