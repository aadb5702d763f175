"""Every link in README.md and docs/*.md goes somewhere: a relative link or image names a file of the checkout
(relative to the page), a ``#anchor`` names a heading of its target page, and a repository path written as
code (`figures/08_serving__*`, `configs/h200_llama8b.yaml`) exists (globs must match something)."""

from __future__ import annotations

import glob
import re
from pathlib import Path

from sdlib.paths import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
#: the folders and files of the checkout's top level that prose names as code
TOP = ("sdlib", "data", "figures", "configs", "notebooks", "tests", "benchmarks", "docs", ".ci")
#: paths the docs name that a command writes and the checkout does not hold (built, ignored or optional)
WRITTEN_BY_A_COMMAND = {
    "data/models_train_log.json",  # `sdlib train fit` writes it beside --out
}


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    h = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", h).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", _without_code_blocks(page.read_text()), flags=re.M)}


def links(page: Path) -> list[str]:
    return LINK.findall(_without_code_blocks(page.read_text()))


def test_every_relative_link_and_image_resolves():
    bad = []
    for page in PAGES:
        for target in links(page):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked here
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.relative_to(REPO_ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{page.relative_to(REPO_ROOT)}: {target} (no heading #{anchor} in {dest.name})")
    assert not bad, "\n".join(bad)
    assert sum(len(links(p)) for p in PAGES) >= 20


def code_paths(page: Path) -> list[str]:
    """Repository paths written as `code` in a page's prose: `figures/...`, `configs/x.yaml`, ... (the
    first word of the span, when it starts with a top-level folder)."""
    out = []
    for span in re.findall(r"`([^`\n]+)`", _without_code_blocks(page.read_text())):
        word = span.split()[0].rstrip(",;:)")
        if re.match(rf"({'|'.join(re.escape(t) for t in TOP)})/", word) and not re.search(r"[<>{}]|\.\.\.", word):
            out.append(word)
    return out


def test_every_repository_path_written_as_code_exists():
    bad = []
    for page in PAGES:
        for p in code_paths(page):
            if p in WRITTEN_BY_A_COMMAND:
                continue
            if not glob.glob(str(REPO_ROOT / p)):
                bad.append(f"{page.relative_to(REPO_ROOT)}: `{p}`")
    assert not bad, "paths the docs name that the checkout lacks:\n" + "\n".join(bad)
    named = {p for page in PAGES for p in code_paths(page)}
    assert WRITTEN_BY_A_COMMAND <= named, f"no page names these any more: {WRITTEN_BY_A_COMMAND - named}"


def test_slugs_are_githubs():
    assert slug("## 06_trace_replay".lstrip("# ")) == "06_trace_replay"
    assert slug("Where the paper's numbers are") == "where-the-papers-numbers-are"
    assert slug("Trace replay: the paper's bounds measured inside vLLM") == "trace-replay-the-papers-bounds-measured-inside-vllm"
