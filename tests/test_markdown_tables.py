"""The markdown tables of README.md and docs/*.md, and the status page's table.

Every table has one cell count in all its rows: header, delimiter row and body rows. markdown-it-py's table rule
(GFM's) finds the tables, then each source line's cells are counted as GFM splits them: on every pipe not escaped
with a backslash, a pipe inside backticks included (`a|b` in a row is two cells; write `a\\|b`), one leading and
one trailing pipe ignored. The rule's own tokens are no check: it pads or cuts every body row to the header's
width, so a row that a stray pipe shifted renders with its last cells dropped and nothing says so. The generated
blocks (`make docs`) are part of the pages and are checked too.

docs/status.md is an index: each cell of its table at most 25 words, details on the pages it links to, and every
relative link it holds points to a file that exists and, where it names one, a heading of that file.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from markdown_it import MarkdownIt
from markdown_it.common.utils import mdTrim
from markdown_it.rules_block.table import escapedSplit

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
STATUS = ROOT / "docs" / "status.md"
MAX_STATUS_WORDS = 25


def parser() -> MarkdownIt:
    return MarkdownIt("commonmark").enable("table")


def cell_count(line: str) -> int:
    """The cells of one table row as GFM counts them: split on pipes not escaped with a backslash (markdown-it's
    own splitter, which its table rule uses for the header and body rows), one leading and one trailing pipe
    ignored."""
    cells = escapedSplit(mdTrim(line))
    if cells and cells[0] == "":
        cells.pop(0)
    if cells and cells[-1] == "":
        cells.pop()
    return len(cells)


def tables(text: str) -> list[tuple[int, list[str]]]:
    """Each table of ``text``: its first line's number (1-based) and its source lines, as markdown-it's table rule
    finds them (so a table inside a fenced code block or an HTML comment is none)."""
    found = []
    lines = text.split("\n")
    quotes = 0
    for token in parser().parse(text):
        if token.type == "blockquote_open":
            quotes += 1
        elif token.type == "blockquote_close":
            quotes -= 1
        elif token.type == "table_open":
            first, end = token.map
            rows = lines[first:end]
            if quotes:      # a table in a block quote: its lines start with the quote's `>` markers
                rows = [re.sub(rf"^\s*(?:>\s?){{1,{quotes}}}", "", row) for row in rows]
            found.append((first + 1, rows))
    return found


def bad_rows(text: str, where: str) -> list[str]:
    """``where:line: N cells, the header has M`` for each row of a table of ``text`` whose cell count is not its
    header's."""
    bad = []
    for first, rows in tables(text):
        header = cell_count(rows[0])
        for offset, row in enumerate(rows[1:], start=1):
            count = cell_count(row)
            if count != header:
                kind = "delimiter row" if offset == 1 else "row"
                bad.append(f"{where}:{first + offset}: {kind} has {count} cells, the header "
                           f"(line {first}) has {header}: {row[:120]}")
    return bad


# ------------------------------------------------------------------------------------------------ the checker itself

GOOD = "| a | b |\n|---|---|\n| `x` | y |\n"


def test_a_table_whose_rows_all_have_the_headers_cells_passes():
    assert [first for first, _ in tables(GOOD)] == [1]
    assert bad_rows(GOOD, "page.md") == []
    assert bad_rows("a | b\n--- | ---\n1 | 2\n", "page.md") == []      # no outer pipes: the same cells


def test_an_unescaped_pipe_inside_backticks_splits_the_cell_and_is_reported_with_file_line_and_counts():
    text = "intro\n\n| flag | what |\n|---|---|\n| `--quant int8|int4` | the draft's weights |\n"
    assert bad_rows(text, "docs/page.md") == [
        "docs/page.md:5: row has 3 cells, the header (line 3) has 2: | `--quant int8|int4` | the draft's weights |"]


def test_an_escaped_pipe_is_no_cell_border_in_backticks_or_out():
    assert bad_rows("| flag | what |\n|---|---|\n| `--quant int8\\|int4` | a \\| b |\n", "page.md") == []


def test_a_row_with_fewer_cells_or_a_wrong_delimiter_row_fails():
    assert len(bad_rows("| a | b | c |\n|---|---|---|\n| 1 | 2 |\n", "page.md")) == 1
    assert bad_rows("| a | b |\n|---|---|\n| 1 | 2 | 3 |\n", "page.md")[0].startswith("page.md:3: row has 3")


def test_a_table_inside_a_fenced_code_block_is_no_table():
    text = "```\n| a | b |\n|---|---|\n| `x|y` | z |\n```\n"
    assert tables(text) == [] and bad_rows(text, "page.md") == []


def test_a_table_in_a_list_or_a_block_quote_is_checked_too():
    assert bad_rows("- item\n\n  | a | b |\n  |---|---|\n  | 1 | 2 | 3 |\n", "page.md")[0].startswith("page.md:5:")
    assert bad_rows("> | a | b |\n> |---|---|\n> | 1 | 2 |\n", "page.md") == []
    assert bad_rows("> | a | b |\n> |---|---|\n> | 1 | `2|3` |\n", "page.md")[0].startswith("page.md:3:")


def test_words_count_the_rendered_text_not_link_targets():
    assert cell_words("see [engine.md](engine.md#a-very-long-anchor-name), `a b`") == ["see", "engine.md,", "a", "b"]


# ------------------------------------------------------------------------------------------------ the pages

@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_table_row_has_its_headers_cell_count(page: Path):
    where = str(page.relative_to(ROOT))
    bad = bad_rows(page.read_text(encoding="utf-8"), where)
    assert not bad, "cells split by an unescaped `|` (write `\\|`, in backticks too):\n" + "\n".join(bad)


def cell_words(markdown: str) -> list[str]:
    """The words of one cell as it renders: its text and code, not its link targets or markup."""
    inline = parser().parseInline(markdown)[0]
    text = "".join(child.content for child in inline.children or [] if child.type in ("text", "code_inline"))
    return text.split()


def status_cells() -> list[tuple[int, str]]:
    """Each cell of docs/status.md's table, with its line number."""
    found = tables(STATUS.read_text(encoding="utf-8"))
    assert len(found) == 1, "docs/status.md has one table"
    first, rows = found[0]
    cells = []
    for offset, row in enumerate(rows):
        if offset == 1:
            continue        # the delimiter row
        parts = escapedSplit(mdTrim(row))
        cells += [(first + offset, mdTrim(part)) for part in parts[1:-1]]
    return cells


def test_each_cell_of_the_status_table_has_at_most_25_words():
    long = [f"docs/status.md:{line}: {len(cell_words(cell))} words: {cell[:80]}"
            for line, cell in status_cells() if len(cell_words(cell)) > MAX_STATUS_WORDS]
    assert not long, f"status cells over {MAX_STATUS_WORDS} words (move the details to the page linked):\n" + \
        "\n".join(long)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text: lowercased, punctuation but hyphens and underscores removed, each space
    a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of ``page``'s headings, a repeated heading's with GitHub's -1, -2, ... suffixes."""
    tokens = parser().parse(page.read_text(encoding="utf-8"))
    counts: dict[str, int] = {}
    found = set()
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            inline = tokens[i + 1]
            base = slug("".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline")))
            found.add(f"{base}-{counts[base]}" if counts.get(base) else base)
            counts[base] = counts.get(base, 0) + 1
    return found


def links(page: Path) -> list[str]:
    """The targets of ``page``'s markdown links."""
    found = []
    for token in parser().parse(page.read_text(encoding="utf-8")):
        for child in token.children or []:
            if child.type == "link_open":
                found.append(str(child.attrs["href"]))
    return found


def test_the_anchor_of_a_heading_is_githubs():
    assert slug("Quantised projections (`python -m pipeline.benchmarks.quant_linear`)".replace("`", "")) == \
        "quantised-projections-python--m-pipelinebenchmarksquant_linear"
    assert slug("The verify step: one contract, several samplers") == "the-verify-step-one-contract-several-samplers"


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file does not exist, or whose anchor is no heading of that file."""
    broken = []
    for href in links(page):
        if re.match(r"^[a-z]+:", href):
            continue        # http(s), mailto: not checked here
        path, _, anchor = href.partition("#")
        target = (page.parent / unquote(path)).resolve() if path else page
        if not target.exists():
            broken.append(f"{href}: no file {path}")
        elif anchor and target.suffix == ".md" and unquote(anchor) not in anchors(target):
            broken.append(f"{href}: no heading with that anchor in {path or page.name}")
    return broken


def test_a_link_to_a_missing_file_or_heading_is_broken(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## The `make pair` run\n")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md) [b](other.md#the-make-pair-run) [c](#top) [d](gone.md) [e](other.md#nothing)\n"
                    "[f](https://example.com/x.md)\n\n# Top\n")
    assert broken_links(page) == ["gone.md: no file gone.md",
                                  "other.md#nothing: no heading with that anchor in other.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_names_an_existing_file_and_heading(page: Path):
    assert not broken_links(page), f"{page.relative_to(ROOT)} links:\n" + "\n".join(broken_links(page))


def test_every_relative_link_of_the_status_page_names_an_existing_file_and_heading():
    broken = broken_links(STATUS)
    assert not broken, "docs/status.md links:\n" + "\n".join(broken)
