"""The README's 15-line API example runs and trains."""
import re
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_api_example_runs_and_reduces_the_gap():
    section = README.split("## The API in 15 lines", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len([line for line in code.splitlines() if line.strip()]) <= 15
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    problem, theta = namespace["problem"], namespace["theta"]
    assert problem.gap(theta) < 0.05 * problem.gap(problem.initial_theta())


def _headline_rows() -> list[list[str]]:
    section = README.split("## Measured results (headline)", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")][2:]    # without header and rule
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]


def test_headline_table_is_a_front_page():
    """At most 8 rows, each one sentence with its date, and each value stated by the page it links."""
    rows = _headline_rows()
    assert 3 <= len(rows) <= 8, len(rows)
    root = Path(__file__).resolve().parents[1]
    for result, value, where in rows:
        sentences = re.findall(r"[.!?](?:\s|$)", result)
        assert len(sentences) == 1 and result.endswith("."), f"not one sentence: {result!r}"
        assert re.search(r"\(20\d\d-\d\d-\d\d\)\.$", result), f"no date at the end: {result!r}"
        assert "[" not in value, f"nested intervals belong in the linked page: {value!r}"
        page = re.fullmatch(r"\[[^\]]+\]\(([^)#]+)(#[^)]*)?\)", where).group(1)
        text = (root / page).read_text()
        for number in re.findall(r"\d+(?:\.\d+)?", value):
            assert number in text, f"{number} ({result[:40]}…) is not in {page}"


def test_language_model_rows_point_to_the_llm_page():
    rows = [row for row in _headline_rows() if re.search(r"SmolLM2|language model|Llama|LoRA", row[0])
            and "memory" not in row[0] and "costs" not in row[0]]
    assert rows and all("docs/llm.md" in where for _, _, where in rows), rows


def test_top_block_example_runs_and_lowers_the_loss(capsys):
    import pytest

    pytest.importorskip("peft")
    section = README.split("## Tuning only the top blocks", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    top, start = namespace["top"], namespace["start"]
    assert top.mean_loss() < 0.9 * start
    assert "F(θ):" in capsys.readouterr().out
