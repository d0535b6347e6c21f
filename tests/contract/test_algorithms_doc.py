"""docs/ALGORITHMS.md: its defaults table is the registry's, and every "ALGORITHMS.md §…" citation in the
repository names a section it has."""

from __future__ import annotations

import re
from pathlib import Path

from contract import algorithms

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ALGORITHMS.md"
SCANNED = ("contract", "trainer", "service", "worker", "store", "experiments", "bench", "tests", "docs")
CITATION = re.compile(r"ALGORITHMS(?:\.md)?\s*((?:§[\w.–-]+(?:\s+(?:and|,)\s+)?)+)")
SECTION = re.compile(r"§(Notation|\d+(?:\.\d+)?)(?:[–-](\d+(?:\.\d+)?))?")


def _sections() -> set[str]:
    text = DOC.read_text(encoding="utf-8")
    found = {"Notation"} if "## Notation" in text else set()
    found |= set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, flags=re.MULTILINE))
    found |= set(re.findall(r"\*\*(\d+\.\d+)\*\*", text))
    return found


def _citations() -> list[tuple[str, str]]:
    files = [ROOT / "README.md"]
    for top in SCANNED:
        files += [p for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".md") and p.is_file()]
    out = []
    for path in files:
        if path == DOC or "__pycache__" in path.parts:
            continue
        for match in CITATION.finditer(path.read_text(encoding="utf-8", errors="replace")):
            for start, end in SECTION.findall(match.group(1)):
                out += [(str(path.relative_to(ROOT)), start)] + (
                    [(str(path.relative_to(ROOT)), end)] if end else []
                )
    return out


def test_the_defaults_table_is_the_registrys() -> None:
    assert algorithms.documented_defaults(DOC.read_text(encoding="utf-8")) == algorithms.render_defaults(), (
        "run `python -m contract.algorithms --write`"
    )


def test_every_citation_names_an_existing_section() -> None:
    sections = _sections()
    assert {"Notation", "1", "3", "4", "4.11", "5", "5.3", "6", "7", "7.1", "7.13", "8", "9"} <= sections
    citations = _citations()
    assert len(citations) >= 24  # the code cites the document throughout
    missing = sorted({(path, section) for path, section in citations if section not in sections})
    assert missing == [], missing


def test_each_registered_algorithm_has_its_section() -> None:
    headings = re.findall(r"^#{2,3} .*$", DOC.read_text(encoding="utf-8"), flags=re.MULTILINE)
    for name in algorithms.names():
        assert any(re.search(rf"(?<![\w`]){name}(?![\w`])|`{name}`", h) for h in headings), name
