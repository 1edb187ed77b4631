"""A small document model rendered to Markdown and to self-contained HTML with the same content."""

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# Inline markup both renderers understand: **bold** and `code`.
_INLINE = re.compile(r"\*\*(.+?)\*\*|`(.+?)`")


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: tuple[bool, ...] = ()  # right-aligned columns; default: every column but the first


@dataclass(frozen=True)
class Image:
    path: Path  # a PNG; Markdown links it relative to the report, HTML embeds it
    alt: str
    caption: str


@dataclass(frozen=True)
class Code:
    text: str


Block = Heading | Paragraph | Bullets | Table | Image | Code


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[bool] = ()) -> Table:
    return Table(tuple(headers), tuple(tuple(row) for row in rows), tuple(numeric))


def to_markdown(blocks: Sequence[Block], base: Path) -> str:
    """Markdown; images are linked relative to `base`, the report's directory."""
    parts = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"{'#' * block.level} {block.text}")
        elif isinstance(block, Paragraph):
            parts.append(block.text)
        elif isinstance(block, Bullets):
            parts.append("\n".join(f"- {item}" for item in block.items))
        elif isinstance(block, Table):
            parts.append(_markdown_table(block))
        elif isinstance(block, Image):
            parts.append(f"![{block.alt}]({block.path.relative_to(base).as_posix()})\n\n*{block.caption}*")
        else:
            parts.append(f"```\n{block.text}\n```")
    return "\n\n".join(parts) + "\n"


def to_html(blocks: Sequence[Block], title: str) -> str:
    """One HTML file with every image embedded as a data: URI, readable offline."""
    body = []
    for block in blocks:
        if isinstance(block, Heading):
            body.append(f"<h{block.level}>{_inline(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            body.append(f"<p>{_inline(block.text)}</p>")
        elif isinstance(block, Bullets):
            items = "".join(f"<li>{_inline(item)}</li>" for item in block.items)
            body.append(f"<ul>{items}</ul>")
        elif isinstance(block, Table):
            body.append(_html_table(block))
        elif isinstance(block, Image):
            data = base64.b64encode(block.path.read_bytes()).decode()
            body.append(
                f'<figure><img alt="{html.escape(block.alt)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{_inline(block.caption)}</figcaption></figure>"
            )
        else:
            body.append(f"<pre>{html.escape(block.text)}</pre>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _numeric(t: Table) -> tuple[bool, ...]:
    return t.numeric or tuple(i > 0 for i in range(len(t.headers)))


def _markdown_table(t: Table) -> str:
    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"

    rule = "|" + "|".join("--:" if right else "---" for right in _numeric(t)) + "|"
    return "\n".join([row(t.headers), rule, *(row(r) for r in t.rows)])


def _html_table(t: Table) -> str:
    align = ["num" if right else "" for right in _numeric(t)]
    head = "".join(f"<th>{_inline(h)}</th>" for h in t.headers)
    rows = "".join(
        "<tr>"
        + "".join(f'<td class="{a}">{_inline(c)}</td>' for c, a in zip(r, align, strict=True))
        + "</tr>"
        for r in t.rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _inline(text: str) -> str:
    out, last = [], 0
    for match in _INLINE.finditer(text):
        out.append(html.escape(text[last : match.start()]))
        bold, code = match.groups()
        out.append(f"<b>{html.escape(bold)}</b>" if bold is not None else f"<code>{html.escape(code)}</code>")
        last = match.end()
    out.append(html.escape(text[last:]))
    return "".join(out)


_CSS = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, pre { background: #f6f6f6; font-size: 0.9em; }
pre { padding: 0.5em; overflow-x: auto; }
figure { margin: 1em 0; }
img { max-width: 100%; }
figcaption { font-style: italic; color: #555; }
"""
