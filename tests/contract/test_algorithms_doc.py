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


# `path/file.py` (`name`, `name2` and prose) as the sections name their code.
LOCATION = re.compile(r"`((?:trainer|contract|tests)/[\w/]+\.py)`(?: \(([^)]*)\))?")
NAME = re.compile(r"`([A-Za-z_][A-Za-z_0-9]*)`")


def test_the_files_and_names_the_sections_cite_exist() -> None:
    text = DOC.read_text(encoding="utf-8").replace("\n", " ")
    cited = LOCATION.findall(text)
    assert len(cited) > 20
    for path, names in cited:
        source = ROOT / path
        assert source.is_file(), path
        code = source.read_text(encoding="utf-8")
        for name in NAME.findall(names):
            defined = re.search(rf"^\s*(?:def|class) {name}\b|^\s*{name}\s*[:=]", code, flags=re.MULTILINE)
            assert defined, f"{path} has no {name}"


def test_the_loss_signature_the_doc_gives_is_every_losss() -> None:
    import inspect

    from trainer.algos import POLICY_LOSSES

    text = DOC.read_text(encoding="utf-8").replace("\n", " ")
    match = re.search(r"one signature `\(([^)]*)\) → \(loss,\s*metrics\)`", text)
    assert match is not None
    documented = [name.strip() for name in match.group(1).split(",")]
    assert documented == ["inputs", "params", "control"]
    for name in POLICY_LOSSES.names():
        parameters = list(inspect.signature(POLICY_LOSSES.get(name).fn).parameters)
        # (inputs, the params object, control): the second is named p in the code.
        assert len(parameters) == 3 and parameters[0] == "inputs" and parameters[2] == "control", name
