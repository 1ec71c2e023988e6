"""Write one result table as CSV, Markdown, LaTeX and an HTML page, with the paper's reference rows marked.

The HTML page is the form the workflow report shows (Snakemake's report displays HTML, images and PDF
inline; a CSV or Markdown file there is only a download link).
"""

from __future__ import annotations

import csv
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pmlm.files import atomic_output

TABLE_SUFFIXES = (".csv", ".md", ".tex", ".html")  # the four forms of a table, in the order write_table returns them


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    fmt: str = "{}"  # applied to numbers; None / NaN render as "–"
    percent: bool = False  # fractions shown as percentages in Markdown / LaTeX


def _cell(value, col: Column) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return col.fmt.format(value * 100 if col.percent else value)
    return str(value)


def _latex_escape(text: str) -> str:
    for a, b in (
        ("\\", r"\textbackslash{}"),
        ("&", r"\&"),
        ("%", r"\%"),
        ("_", r"\_"),
        ("#", r"\#"),
        ("–", "--"),
        (">=", r"$\geq$"),
    ):
        text = text.replace(a, b)
    return text


def write_table(
    rows: Sequence[dict], columns: Sequence[Column], prefix: str | Path, *, caption: str, source_key: str = "source"
) -> list[Path]:
    """Write ``prefix``.csv (raw values), .md, .tex and .html (formatted), each to a temporary name renamed when
    complete; returns the four paths. A command that writes several files at once writes them through a staging
    folder (pmlm.reports.staging).

    Each row carries ``source_key`` ("paper" or "ours"); the formatted tables show it as the
    first column so reference and reproduced numbers are never confused.
    """
    prefix = Path(prefix)
    cols = [Column(source_key, "source")] + [c for c in columns if c.key != source_key]
    paths = [Path(str(prefix) + ext) for ext in TABLE_SUFFIXES]
    with atomic_output(paths[0]) as tmp, open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[c.key for c in cols], extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({c.key: row.get(c.key) for c in cols})
    body = [[_cell(row.get(c.key), c) for c in cols] for row in rows]
    md = [
        f"**{caption}**",
        "",
        "| " + " | ".join(c.title for c in cols) + " |",
        "|" + "|".join("---" for _ in cols) + "|",
    ]
    md += ["| " + " | ".join(cells) + " |" for cells in body]
    with atomic_output(paths[1]) as tmp:
        Path(tmp).write_text("\n".join(md) + "\n")
    tex = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{_latex_escape(caption)}}}",
        r"\begin{tabular}{" + "l" * 2 + "r" * (len(cols) - 2) + "}",
        r"\toprule",
        " & ".join(_latex_escape(c.title) for c in cols) + r" \\",
        r"\midrule",
    ]
    previous = None
    for row, cells in zip(rows, body):
        if previous is not None and row.get(source_key) != previous:
            tex.append(r"\midrule")
        previous = row.get(source_key)
        tex.append(" & ".join(_latex_escape(c) for c in cells) + r" \\")
    tex += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    with atomic_output(paths[2]) as tmp:
        Path(tmp).write_text("\n".join(tex) + "\n")
    with atomic_output(paths[3]) as tmp:
        Path(tmp).write_text(
            html_page(prefix.name, caption, [c.title for c in cols], body, [row.get(source_key) for row in rows])
        )
    return paths


HTML_STYLE = """body{font-family:sans-serif;margin:1.5em;color:#111}caption{caption-side:top;text-align:left;
max-width:60em;margin-bottom:.6em}table{border-collapse:collapse;font-size:.9em}th,td{padding:.25em .7em;
border-bottom:1px solid #ccc;text-align:right}th:first-child,td:first-child,th:nth-child(2),td:nth-child(2)
{text-align:left}tr.paper td{color:#555;background:#f4f4f4}th{border-bottom:2px solid #333}"""


def html_page(
    title: str, caption: str, header: Sequence[str], body: Sequence[Sequence[str]], sources: Sequence[str | None]
) -> str:
    """A standalone page with one table; rows of the paper are shaded (class ``paper``)."""
    esc = html.escape
    lines = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title>",
        f"<style>{HTML_STYLE}</style></head><body>",
        f'<table id="{esc(title)}">',
        f"<caption>{esc(caption)}</caption>",
        "<thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr></thead>",
        "<tbody>",
    ]
    for cells, source in zip(body, sources):
        cls = f' class="{esc(str(source))}"' if source else ""
        lines.append(f"<tr{cls}>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    lines += ["</tbody></table>", "</body></html>"]
    return "\n".join(lines) + "\n"
