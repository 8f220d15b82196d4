"""The documents stay readable and their references hold: the README short enough to read in minutes, docs/benchmarks.md
by subject, every section of it that code or docs cite by name present, and every relative link landing on a file and
heading that exist."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
DOCUMENTS = sorted([README, *(ROOT / "docs").rglob("*.md")])
CODE_BLOCK = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^(#+) (.*)$", re.MULTILINE)
# a section cited by name: docs/benchmarks.md, "Many watchers" (across a line break, in a comment or a docstring)
CITATION = re.compile(r'benchmarks\.md,?[\s#]*"([^"]+)"')
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    return CODE_BLOCK.sub("", text)


def _headings(path: Path) -> list[tuple[int, str]]:
    return [(len(hashes), title.strip()) for hashes, title in HEADING.findall(_prose(path.read_text()))]


def _anchor(title: str) -> str:
    """The anchor GitHub (and the Hub) give a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def test_the_readme_is_short_and_its_paragraphs_too():
    text = README.read_text()
    assert len(text.encode()) <= 12 * 1024, f"README.md is {len(text.encode()):,} bytes; at most 12 KB"
    body = _prose(text.split("---", 2)[2])  # after the Space's header
    for block in re.split(r"\n\s*\n", body):
        if block.lstrip().startswith(("|", "<img")):
            continue  # tables and pictures are not paragraphs
        for item in re.split(r"\n(?=- |\d+\. )", block):  # each bullet is a paragraph of its own
            assert len(item) <= 800, f"a README paragraph of {len(item)} characters: {item[:100]!r}..."


def test_the_benchmarks_are_ordered_by_subject():
    sections = [title for level, title in _headings(BENCHMARKS) if level == 2]
    assert sections == ["Training speed", "The app's cost", "Retrieval", "Start-up", "The test suite", "GPU",
                        "Sittings"]
    named_by_issue = [title for _, title in _headings(BENCHMARKS) if re.search(r"\bissues? \d", title)]
    assert named_by_issue == []


def _citations() -> list[tuple[str, str]]:
    sources = [path for pattern in ("*.py", "*.md", "Makefile") for path in ROOT.rglob(pattern)
               if path.relative_to(ROOT).parts[0] not in (".venv", "runs", ".git", "test-output")
               and path != Path(__file__)]  # this file's own example is no citation
    return sorted({(path.relative_to(ROOT).as_posix(), " ".join(name.split()))
                   for path in sources for name in CITATION.findall(path.read_text(errors="replace"))})


@pytest.mark.parametrize(("source", "section"), _citations())
def test_a_cited_benchmarks_section_exists(source, section):
    titles = [title.lower() for _, title in _headings(BENCHMARKS)]
    assert any(section.lower() in title for title in titles), f"{source} cites a section no heading names: {section!r}"


def _links() -> list[tuple[str, str]]:
    return sorted({(path.relative_to(ROOT).as_posix(), link) for path in DOCUMENTS
                   for link in LINK.findall(_prose(path.read_text()))
                   if not link.startswith(("http://", "https://", "mailto:"))})


@pytest.mark.parametrize(("document", "link"), _links())
def test_a_relative_link_lands(document, link):
    source = ROOT / document
    target, _, anchor = link.partition("#")
    path = (source.parent / target).resolve() if target else source
    assert path.exists(), f"{document} links to {target}, which does not exist"
    if anchor and path.suffix == ".md":
        assert anchor in {_anchor(title) for _, title in _headings(path)}, f"{document}: no heading for #{anchor}"
