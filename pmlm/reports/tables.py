"""Write one result table as CSV, Markdown and LaTeX, with the paper's reference rows marked."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pmlm.utils import atomic_output


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
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"), ("–", "--"),
                 (">=", r"$\geq$")):
        text = text.replace(a, b)
    return text


def write_table(rows: Sequence[dict], columns: Sequence[Column], prefix: str | Path, *, caption: str,
                source_key: str = "source") -> list[Path]:
    """Write ``prefix``.csv (raw values), .md and .tex (formatted); returns the three paths.

    Each row carries ``source_key`` ("paper" or "ours"); the formatted tables show it as the
    first column so reference and reproduced numbers are never confused.
    """
    prefix = Path(prefix)
    cols = [Column(source_key, "source")] + [c for c in columns if c.key != source_key]
    paths = [prefix.with_suffix(ext) for ext in (".csv", ".md", ".tex")]
    with atomic_output(paths[0]) as tmp, open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[c.key for c in cols], extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({c.key: row.get(c.key) for c in cols})
    body = [[_cell(row.get(c.key), c) for c in cols] for row in rows]
    md = [f"**{caption}**", "", "| " + " | ".join(c.title for c in cols) + " |",
          "|" + "|".join("---" for _ in cols) + "|"]
    md += ["| " + " | ".join(cells) + " |" for cells in body]
    with atomic_output(paths[1]) as tmp:
        Path(tmp).write_text("\n".join(md) + "\n")
    tex = [r"\begin{table}[t]", r"\centering", rf"\caption{{{_latex_escape(caption)}}}",
           r"\begin{tabular}{" + "l" * 2 + "r" * (len(cols) - 2) + "}", r"\toprule",
           " & ".join(_latex_escape(c.title) for c in cols) + r" \\", r"\midrule"]
    previous = None
    for row, cells in zip(rows, body):
        if previous is not None and row.get(source_key) != previous:
            tex.append(r"\midrule")
        previous = row.get(source_key)
        tex.append(" & ".join(_latex_escape(c) for c in cells) + r" \\")
    tex += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    with atomic_output(paths[2]) as tmp:
        Path(tmp).write_text("\n".join(tex) + "\n")
    return paths
