"""MkDocs hook: repository files outside docs/ that the site shows, and the links to them.

The benchmark results, the model card, the research record and the changelog live beside what
they describe (bench/, models/default/, research/, the root), and the README and these pages
link to them by their repository paths, so every link also works when the Markdown is read in
the repository.
This hook adds those files to the site (Markdown as pages, the rest as downloads) and rewrites
each relative link that points at one of them, from any page, to its place in the site. A link to
a repository file that is not mounted here is left alone, so `mkdocs build --strict` fails on it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
# repository glob -> the site folder it goes to (a name ending in .md: that one page)
MOUNTS = {
    "bench/RESULTS.md": "benchmarks/results.md",
    "models/default/MODEL_CARD.md": "model-card.md",
    "research/RECORD.md": "research.md",
    "CHANGELOG.md": "changelog.md",
}
LINK = re.compile(r"(\]\()([^)\s]+)(\))")


def mounted() -> dict[str, str]:
    """Repository path -> site path of every mounted file."""
    found = {}
    for pattern, target in MOUNTS.items():
        for path in sorted(ROOT.glob(pattern)):
            repo_path = path.relative_to(ROOT).as_posix()
            found[repo_path] = target if target.endswith(".md") else f"{target}/{path.name}"
    return found


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for repo_path, site_path in mounted().items():
        files.append(File.generated(config, site_path, abs_src_path=str(ROOT / repo_path)))
    return files


def repo_path_of(page: Page, config: MkDocsConfig) -> str:
    """Where the page's Markdown lives in the repository."""
    if page.file.abs_src_path:
        source = Path(page.file.abs_src_path).resolve()
    else:
        source = Path(config.docs_dir).resolve() / page.file.src_uri
    return source.relative_to(ROOT).as_posix()


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    sites = mounted()
    docs_prefix = Path(config.docs_dir).resolve().relative_to(ROOT).as_posix() + "/"
    here = posixpath.dirname(repo_path_of(page, config))
    page_dir = posixpath.dirname(page.file.src_uri)

    def rewrite(match: re.Match) -> str:
        target, _, anchor = match.group(2).partition("#")
        if not target or re.match(r"[a-z][a-z0-9+.-]*:|/", target):  # URLs, absolute paths, #anchors
            return match.group(0)
        repo_target = posixpath.normpath(posixpath.join(here, target))
        if repo_target in sites:
            site_target = sites[repo_target]
        elif repo_target.startswith(docs_prefix):  # a docs page, linked from a mounted file
            site_target = repo_target[len(docs_prefix):]
        else:
            return match.group(0)
        new = posixpath.relpath(site_target, page_dir or ".") + (f"#{anchor}" if anchor else "")
        return f"{match.group(1)}{new}{match.group(3)}"

    return LINK.sub(rewrite, markdown)
