"""Every docstring example of the library, the course and the benchmarks runs as written (the examples are documentation)."""
import doctest
import importlib
import os
import pkgutil

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import benchmarks
import sazo_lite

MODULES = sorted(info.name for package in (sazo_lite, benchmarks)
                 for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")
                 if not info.name.endswith(".__main__"))      # importing an entry point runs it


def test_every_module_is_found():
    assert {"sazo_lite.train", "sazo_lite.llm.queries", "sazo_lite.course.widgets.llm",
            "benchmarks.run_cache", "benchmarks.queries"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run_as_written(name):
    module = importlib.import_module(name)
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    failed = []
    for test in finder.find(module, name):
        result = runner.run(test, out=lambda text: failed.append(text))
        assert result.failed == 0, "".join(failed)
