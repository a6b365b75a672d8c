"""The README is read by a newcomer in five minutes: within 1,500 words, the two commands that
``.ci/run`` and the Makefile carry, and every document it links exists."""

import re

from conftest import ROOT

README = ROOT / "README.md"
MAX_WORDS = 1500


def test_readme_is_short():
    words = len(README.read_text().split())
    assert words <= MAX_WORDS, f"README.md: {words} words (limit {MAX_WORDS})"


def test_readme_keeps_the_two_commands_and_the_sections():
    text = README.read_text()
    assert "make lab" in text and "make test" in text
    for heading in ("## Set-up: two commands", "## The library", "## Grading a class"):
        assert heading in text, heading


def test_every_linked_document_exists():
    text = README.read_text()
    links = re.findall(r"\]\(([^)#]+)\)", text)
    assert links, "the README links its documents"
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, missing
    listed = {link for link in links if link.startswith("docs/")}
    on_disk = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert on_disk <= listed, f"documents the README does not index: {sorted(on_disk - listed)}"
