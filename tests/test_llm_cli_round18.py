"""Round 18: make bench-llm's opt-in opposed and balanced sets are refused at the command line where they cannot
be drawn, and their default size can be."""
import pytest

from benchmarks import llm_queries


def test_balanced_set_past_its_distinct_questions_is_refused_before_any_model_loads(capsys):
    """``--sets opposed`` / ``balanced`` at the old default N = 192 asked their setups for 168 distinct sentiment
    questions of 160: the set builder refused only once SmolLM2 had loaded (and, since sets are named by their
    examples, in the run key). The default is 96 now, the size of every documented race."""
    assert llm_queries.parse_args(["--sets", "opposed"]).big_n == 96
    with pytest.raises(SystemExit):
        llm_queries.parse_args(["--sets", "balanced", "--big-n", "192"])
    err = capsys.readouterr().err
    assert "--big-n" in err and "balanced" in err and "160" in err
    with pytest.raises(SystemExit):
        llm_queries.parse_args(["--measure-sets", "balanced", "--big-n", "184"])


@pytest.mark.parametrize("argv", [["--sets", "balanced", "--big-n", "183"], ["--sets", "opposed"],
                                  ["--measure-sets", "opposed", "balanced", "--big-n", "96"]])
def test_sets_that_can_be_drawn_are_taken(argv):
    args = llm_queries.parse_args(argv)
    assert llm_queries._undrawable_big_set(args) is None
