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
