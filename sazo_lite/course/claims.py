"""The numbers a notebook's text states, and the numbers its cells print: are the first among the second?

A chapter's prose (markdown cells) may quote a number only where the reader can see it printed:
by a cell of the same run (fast mode, ``SAZO_FAST=1``, is what CI and the book show), or, inside a
sentence that says "class mode" (or "class run"), by the stored class-mode run of the notebook
(``benchmarks/reference/class_runs/<notebook>.txt``, written by ``python -m benchmarks.class_runs``).
Settings the code shows (a literal in a code cell, such as ``steps=pick(600, 150)``), small counts
(integers up to 10 without a × or %) and the few derived figures a test lists with their reason are
exempt. The notation box, the time line, exercises, references and links are not claims.

``tests/test_course_claims.py`` applies this to every chapter; ``unprinted`` is the one rule.

Example:
    >>> stated_numbers("The oracle is ≈ 10.5× better (B = 8), `pick(3, 2)` aside.")
    [('10.5×', 10.5, 1, False)]
    >>> printed("gain 10.512 at θ₀")
    [10.512]
    >>> matches((10.5, 1), [10.512]), matches((10.6, 1), [10.512])
    (True, False)
"""
from __future__ import annotations

import hashlib
import html as html_lib
import json
import re
from pathlib import Path

__all__ = ["stated_numbers", "printed", "matches", "prose", "output_text", "code_literals", "code_digest",
           "unprinted"]

# A number as prose writes it: 1,200 · 0.25 · 1e-9 · 1e−9 · −0.012 · 10⁶ (the superscript is dropped).
_NUMBER = re.compile(r"(?<![\w.^_{\\])[−-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][−-]?\d+)?(?![\w])"
                     r"(?:\s?[×%])?")
_CLASS = re.compile(r"class[- ](?:mode|run)", re.I)


def prose(markdown: str) -> str:
    """The claims part of a markdown cell: without code, links' targets, HTML tags, headings, the
    notation box, the time line, and everything from an "Exercises" or "References" heading on."""
    text = re.split(r"^#+ (?:Exercises|References)\b", markdown, flags=re.M)[0]
    text = re.sub(r"<details open><summary><b>Notation</b>.*?</details>", " ", text, flags=re.S)
    text = re.sub(r"^\*\*Time\.\*\*.*$", " ", text, flags=re.M)
    text = re.sub(r"^(?:Worked solutions:|\*\*Next:\*\*).*$", " ", text, flags=re.M)
    text = re.sub(r"^#+ .*$", " ", text, flags=re.M)                    # headings: section numbers
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", " ", text)                  # links: their text names a page
    text = re.sub(r"<[^>]+>", " ", text)
    text = re.sub(r"\\(?:cdot|times)", " × ", text)
    text = re.sub(r"\b(?:[Ss]ections?|[Nn]otebooks?|[Ll]ab) \d+(?:\.\d+)?|\b\d\.\d's\b", " ", text)   # references
    text = re.sub(r"(et al\.,?\s*\(?)(?:19|20)\d\d", r"\1", text)                                   # citations
    return text


def _value(token: str) -> tuple[float, int]:
    """(value, decimals) of a number token; decimals is the precision the text states."""
    core = token.rstrip("×% ").replace(",", "").replace("−", "-")
    mantissa = re.split(r"[eE]", core)[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return float(core), decimals


def stated_numbers(markdown: str) -> list[tuple[str, float, int, bool]]:
    """The numbers a markdown cell states as (token, value, decimals, class_mode), settings aside.

    Small counts (integers 0–10 without × or %) are not claims. ``class_mode`` is true for a
    number in a sentence that names the class-mode run.
    """
    found = []
    for sentence in re.split(r"(?<=[.!?;])\s+(?=[A-Z*(])|\n\s*\n|\n\s*[*-] ", prose(markdown)):
        class_mode = bool(_CLASS.search(sentence))
        for match in _NUMBER.finditer(sentence):
            token = match.group(0).strip()
            value, decimals = _value(token)
            if decimals == 0 and abs(value) <= 10 and not token.endswith(("×", "%")):
                continue
            found.append((token, value, decimals, class_mode))
    return found


def printed(text: str) -> list[float]:
    """Every number in a printout (thousands separators and scientific notation read)."""
    return [_value(m.group(0))[0] for m in re.finditer(r"[−-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][−+-]?\d+)?",
                                                       text)]


def matches(stated: tuple[float, int], values) -> bool:
    """True if some printed value rounds to the stated one at the precision the text gives."""
    value, decimals = stated
    for candidate in values:
        for sign in (1, -1):
            if round(sign * candidate, decimals) == round(value, decimals) or (
                    value and abs(sign * candidate - value) <= 1e-9 * abs(value)):
                return True
    return False


def output_text(notebook: dict) -> str:
    """What a reader of the executed notebook sees printed: streams, text and HTML outputs (tables,
    the static view of a dashboard), without scripts (a figure's data is not a printout)."""
    parts = []
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            if output["output_type"] == "stream":
                parts.append("".join(output["text"]))
            data = output.get("data", {})
            if "text/html" in data:
                page = re.sub(r"<(script|style)\b.*?</\1>", " ", "".join(data["text/html"]), flags=re.S)
                parts.append(html_lib.unescape(re.sub(r"<[^>]+>", " ", page)))
            elif "text/plain" in data and not set(data) & {"application/vnd.plotly.v1+json",
                                                           "application/vnd.jupyter.widget-view+json"}:
                parts.append("".join(data["text/plain"]))
    return "\n".join(parts)


def code_literals(notebook: dict) -> list[float]:
    """The numbers written in the code cells: the settings a reader sees in the code."""
    return printed("\n".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"))


def code_digest(notebook: dict) -> str:
    """A short hash of the code cells: a stored run belongs to the code that printed it."""
    code = "\n\0".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code")
    return hashlib.sha256(code.encode()).hexdigest()[:16]


def unprinted(notebook: dict, run: dict, class_run: str | None = None, derived=()) -> list[str]:
    """The numbers ``notebook``'s prose states that neither ``run`` (the same notebook executed) prints
    nor its code sets, nor (in a class-mode sentence) ``class_run`` (the stored class-mode printout)
    prints, and that are not in ``derived`` (stated tokens with a reason elsewhere).

    Returns one line per such number: the token and the sentence's start.
    """
    values, settings = printed(output_text(run)), code_literals(notebook)
    in_class = printed(class_run) if class_run else []
    missing = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for token, value, decimals, class_mode in stated_numbers("".join(cell["source"])):
            if token in derived or token.rstrip("×% ") in derived:
                continue
            if matches((value, decimals), in_class if class_mode else values):
                continue
            if any(value == setting for setting in settings):
                continue
            where = "the stored class run" if class_mode else "the run"
            missing.append(f"cell {index}: {token!r} is not printed by {where}")
    return missing


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())
