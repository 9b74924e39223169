"""docs/en and docs/zh are the same documents in two languages (issue 45): a check keeps them in step, not care.

For each pair it compares what a translation keeps as it is: the heading outline, the numbers stated, the names in
code spans (valves, files, columns), and the valve table of overview.md against ``Filter.Valves`` (names, order,
defaults, and a Chinese row that says as much as the English one). Wording is free; a section, a figure or a
name present in one language only is drift, and fails here naming the file and what is missing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import async_context_compression as acc

ROOT = Path(__file__).resolve().parents[2]
EN, ZH = ROOT / "docs" / "en", ROOT / "docs" / "zh"
PAIRS = sorted(p.name for p in EN.glob("*.md"))

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
HEADING = re.compile(r"^(#{1,6}) ", re.M)
# a number standing alone: not part of a name (cl100k, o200k_base, v2) or of a longer number
NUMBER = re.compile(r"(?<![A-Za-z0-9_.])\d[\d,]*(?:\.\d+)?(?![\d_])")
# the same amount written the way each language counts: 1.1M = 1.1 million = 110 万
LARGE = {"en": re.compile(r"(\d+(?:\.\d+)?)(?: million|M\b)"), "zh": re.compile(r"(\d+(?:\.\d+)?) ?万")}
SCALE = {"en": 1_000_000, "zh": 10_000}
SPAN = re.compile(r"`([^`\n]+)`")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")  # a valve, a file, a column: never translated


def read(folder: Path, name: str) -> str:
    return (folder / name).read_text(encoding="utf-8")


def prose(text: str) -> str:
    """The text without fenced blocks (shown output and commands may differ: a translated comment, a wrapped line)
    and without link targets (each language links its own pages and anchors)."""
    return re.sub(r"\]\([^)]*\)", "]", FENCE.sub("", text))


def outline(text: str) -> list:
    return [len(m.group(1)) for m in HEADING.finditer(FENCE.sub("", text))]


def numbers(text: str, language: str) -> set:
    text = prose(text)
    large = {str(round(float(m.group(1)) * SCALE[language])) for m in LARGE[language].finditer(text)}
    text = LARGE[language].sub(" ", text)
    return {n.replace(",", "") for n in NUMBER.findall(text)} | large


def names(text: str) -> set:
    return {s for s in SPAN.findall(prose(text)) if NAME.match(s) and ("_" in s or "/" in s)}


def test_every_document_has_its_translation():
    assert PAIRS, "docs/en is empty"
    chinese = {p.name for p in ZH.glob("*.md")} - {"README.md"}  # docs/zh/README.md: the README's translation
    assert set(PAIRS) == chinese, f"only in English: {set(PAIRS) - chinese}; only in Chinese: {chinese - set(PAIRS)}"


@pytest.mark.parametrize("name", PAIRS)
def test_headings_have_the_same_outline(name):
    en, zh = outline(read(EN, name)), outline(read(ZH, name))
    assert en == zh, f"{name}: English headings by level {en}, Chinese {zh}"


@pytest.mark.parametrize("name", PAIRS)
def test_the_same_numbers_are_stated(name):
    en, zh = numbers(read(EN, name), "en"), numbers(read(ZH, name), "zh")
    assert en == zh, f"{name}: numbers only in English {sorted(en - zh)}, only in Chinese {sorted(zh - en)}"


@pytest.mark.parametrize("name", PAIRS)
def test_the_same_names_are_quoted(name):
    en, zh = names(read(EN, name)), names(read(ZH, name))
    assert en == zh, f"{name}: names only in English {sorted(en - zh)}, only in Chinese {sorted(zh - en)}"


def valve_rows(language: str) -> list:
    """(name, default, meaning) of each row of overview.md's valve table: the first table whose rows name valves."""
    rows = []
    for line in read(EN if language == "en" else ZH, "overview.md").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| `") else []
        if len(cells) >= 3 and re.fullmatch(r"`\w+`", cells[0]):
            rows.append((cells[0].strip("`"), cells[1], "|".join(cells[2:])))
        elif rows and not line.startswith("|"):
            break
    return rows


def as_written(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return '""' if value == "" else str(value)


@pytest.mark.parametrize("language", ["en", "zh"])
def test_the_valve_table_is_filter_valves(language):
    fields = acc.Filter.Valves.model_fields
    rows = valve_rows(language)
    table = [r[0] for r in rows]
    assert len(table) == len(set(table)), f"overview.md ({language}): a valve listed twice: {table}"
    assert set(table) == set(fields), (
        f"overview.md ({language}): valves only in the table {set(table) - set(fields)}, "
        f"only in Filter.Valves {set(fields) - set(table)}"
    )
    wrong = [(n, d, as_written(fields[n].default)) for n, d, _ in rows if d != as_written(fields[n].default)]
    assert not wrong, f"overview.md ({language}): (valve, default in the table, default in the code) {wrong}"


def test_each_chinese_valve_row_says_what_the_english_one_says():
    """The same numbers and names per row, and not a fraction of its length: the same content in Chinese takes 0.3
    to 0.8 of the English characters here; a row under a fifth lost a part."""
    chinese = {name: meaning for name, _, meaning in valve_rows("zh")}
    for name, _, en in valve_rows("en"):
        zh = chinese.get(name, "")
        assert numbers(en, "en") == numbers(zh, "zh"), (name, numbers(en, "en") ^ numbers(zh, "zh"))
        assert names(en) == names(zh), (name, names(en) ^ names(zh))
        assert len(en.split("*")) == len(zh.split("*")), f"{name}: emphasis (a cross-reference) in one language only"
        assert len(zh) >= len(en) / 5, f"{name}: the Chinese row is {len(zh)} characters for {len(en)} in English"
