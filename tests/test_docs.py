"""The documentation holds together: every relative link resolves, and the README stays the door.

Links are checked the way GitHub renders them: a path relative to the page, and an anchor that is
the slug of a heading of the target page (code blocks are not headings). Code comments that cite
``docs/concepts.md#anchor`` are checked the same way, so an invariant's section cannot be renamed
without its citations.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGES = sorted([REPO / "README.md", REPO / "overlays/README.md", *(REPO / "docs").rglob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
CITATION = re.compile(r"docs/concepts\.md#([\w-]+)")


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code, where links and headings are not."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor GitHub generates for the headings of ``page`` (repeats get ``-1``, ``-2``)."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def shown(page: Path) -> str:
    """``page`` as a message names it: relative to the repository when it is in it."""
    return page.relative_to(REPO).as_posix() if page.is_relative_to(REPO) else str(page)


def broken(page: Path, target: str) -> str | None:
    """Why the relative link ``target`` on ``page`` does not resolve, or None when it does."""
    path_part, _, anchor = target.partition("#")
    resolved = (page.parent / path_part).resolve() if path_part else page
    if not resolved.exists():
        return f"{shown(page)}: {target} names a file that does not exist"
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        return f"{shown(page)}: {target} names no heading of {resolved.name}"
    return None


def relative_links(page: Path) -> list[str]:
    """The links of ``page`` that point into the repository (not http, mailto, ...)."""
    links = LINK.findall(prose(page.read_text(encoding="utf-8")))
    return [link for link in links if not re.match(r"[a-z][a-z0-9+.-]*:", link)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    problems = [p for link in relative_links(page) if (p := broken(page, link))]
    assert not problems, "\n".join(problems)


def test_the_checker_sees_broken_links_and_anchors(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n## The `round`, again\n\n```text\n# not a heading\n```\n")
    assert broken(page, "#the-round-again") is None
    assert broken(page, "page.md#top") is None
    assert broken(page, "#not-a-heading") is not None
    assert broken(page, "missing.md") is not None


def test_readme_links_every_docs_page() -> None:
    readme_links = {link.partition("#")[0] for link in relative_links(REPO / "README.md")}
    for page in (REPO / "docs").rglob("*.md"):
        assert page.relative_to(REPO).as_posix() in readme_links, f"README does not link {page}"


def test_invariants_are_defined_once_and_cited_by_anchor() -> None:
    concepts = REPO / "docs/concepts.md"
    defined = anchors(concepts)
    for invariant in (
        "deterministic-aggregation",
        "residency",
        "no-pickle",
        "checkpoint-integrity",
    ):
        assert invariant in defined
    cited: set[str] = set()
    sources = [*(REPO / "runtime").rglob("*.py"), *(REPO / "infra").rglob("*.py")]
    for source in sources:
        text = source.read_text(encoding="utf-8")
        assert not re.search(r"\b(RFC-\d+|INV-[A-Z])", text), (
            f"{source.relative_to(REPO)} cites a document outside the repository; "
            "link docs/concepts.md instead"
        )
        for anchor in CITATION.findall(text):
            assert anchor in defined, f"{source.relative_to(REPO)} cites a missing #{anchor}"
            cited.add(anchor)
    assert {"deterministic-aggregation", "residency", "checkpoint-integrity"} <= cited


def test_readme_quick_start_is_what_ci_runs() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    ci = (REPO / ".ci/run").read_text(encoding="utf-8")
    commands = re.findall(r"```bash\n(.+?)\n```", readme, re.DOTALL)
    dev = next(c for c in commands if "tools.vendor sync" in c)
    # CI installs with -q and runs the test command on its own line: the same steps, in order.
    ci_steps = [
        "pip install torch==2.13.0",
        "pip install -c constraints.txt -e '.[dev,dp,infra,train,worldmodel]'",
        "python -m tools.vendor sync",
        "ruff check . && ruff format --check . && mypy && lint-imports && pytest",
    ]
    assert dev == " && ".join(ci_steps)
    assert ci_steps[-1] in ci.splitlines()
    for step in ci_steps[:-1]:
        assert step.replace("pip install ", "pip install -q ") in ci or step in ci
    assert "`pytest -m unit` is the quick loop" in readme
