"""A printout as a table: the course's long printouts rendered as HTML, read as plain text too.

Example:
    >>> table = Table(["σ", "1 + CV²"], [[0.0, 1.62], [1.5, 10.3]], caption="the oracle's gain")
    >>> print(table)
    the oracle's gain
    σ    1 + CV²
    0    1.62
    1.5  10.3
    >>> "<th>σ</th>" in table._repr_html_()
    True
"""
from __future__ import annotations

import html

__all__ = ["Table"]


class Table:
    """Rows under a header; shows as an HTML table in a notebook (and the book), as text elsewhere."""

    def __init__(self, header, rows, *, caption: str = ""):
        self.header, self.caption = [str(h) for h in header], caption
        self.rows = [[_cell(value) for value in row] for row in rows]
        if any(len(row) != len(self.header) for row in self.rows):
            raise ValueError(f"Invalid rows: every row needs {len(self.header)} cells")

    def __repr__(self) -> str:
        widths = [max(len(line[i]) for line in [self.header, *self.rows]) for i in range(len(self.header))]
        lines = [self.caption] if self.caption else []
        lines += ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [self.header, *self.rows]]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in self.rows)
        caption = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        return f"<table class='sazo-table'>{caption}<tr>{head}</tr>{body}</table>"


def _cell(value) -> str:
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):   # a numpy scalar or a 0-d tensor: its number
        value = value.item()
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
    return str(value)
