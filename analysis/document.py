"""A small document model (headings, paragraphs, bullet lists, tables, figures) rendered to Markdown and to one
self-contained HTML page (inline CSS, no scripts, no network; figures referenced by relative path)."""

from __future__ import annotations

import dataclasses
import html
import math

CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1180px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}h1,h2,h3{line-height:1.2}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;
margin-top:2em}table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.86em}th,td{border:1px solid #ccc;
padding:.25em .5em;text-align:left;vertical-align:top}th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.85em;color:#555}
code{background:#f3f3f3;padding:0 .2em}.note{color:#7a4b00}"""


@dataclasses.dataclass
class Heading:
    level: int
    text: str


@dataclasses.dataclass
class Para:
    text: str
    note: bool = False  # a caveat, shown highlighted in HTML


@dataclasses.dataclass
class Bullets:
    items: list[str]


@dataclasses.dataclass
class Table:
    columns: list[str]
    rows: list[list]


@dataclasses.dataclass
class Figure:
    src: str      # path relative to the report
    caption: str


@dataclasses.dataclass
class Html:
    """Markup the report's own code built (already escaped where it holds text), for report.html as is, and its
    Markdown stand-in for report.md."""
    html: str
    markdown: str


def cell(value) -> str:
    """How a table cell prints: '–' for missing, 3 significant decimals for floats."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-3 and value != 0 else f"{value:.3f}"
    return str(value)


def to_markdown(blocks: list) -> str:
    """The blocks as GitHub-flavoured Markdown."""
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out += ["#" * b.level + " " + b.text, ""]
        elif isinstance(b, Para):
            out += [("> " if b.note else "") + b.text, ""]
        elif isinstance(b, Bullets):
            out += [f"- {item}" for item in b.items] + [""]
        elif isinstance(b, Table):
            out.append("| " + " | ".join(_md_cell(c) for c in b.columns) + " |")
            out.append("|" + "---|" * len(b.columns))
            out += ["| " + " | ".join(_md_cell(cell(v)) for v in row) + " |" for row in b.rows]
            out.append("")
        elif isinstance(b, Figure):
            alt = b.src.rsplit("/", 1)[-1].rsplit(".", 1)[0]
            out += [f"![{alt}]({b.src})", "", f"*{b.caption}*", ""]
        elif isinstance(b, Html):
            out += [b.markdown, ""]
        else:
            raise TypeError(f"not a document block: {type(b).__name__}")
    return "\n".join(out).rstrip() + "\n"


def to_html(blocks: list, title: str) -> str:
    """The blocks as one HTML page with inline CSS."""
    esc = html.escape
    body: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            body.append(f"<h{b.level}>{esc(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            attrs = ' class="note"' if b.note else ""
            body.append(f"<p{attrs}>{_inline(b.text)}</p>")
        elif isinstance(b, Bullets):
            body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{esc(str(c))}</th>" for c in b.columns)
            rows = "".join("<tr>" + "".join(f"<td>{esc(cell(v))}</td>" for v in row) + "</tr>" for row in b.rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif isinstance(b, Figure):
            body.append(f'<figure><img src="{esc(b.src, quote=True)}" alt="{esc(b.caption, quote=True)}">'
                        f"<figcaption>{_inline(b.caption)}</figcaption></figure>")
        elif isinstance(b, Html):
            body.append(b.html)
        else:
            raise TypeError(f"not a document block: {type(b).__name__}")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _inline(text: str) -> str:
    """HTML-escape text, turning `code` spans into <code> and **bold** into <b>."""
    parts = html.escape(text).split("`")
    s = "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))
    bold = s.split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(bold))
