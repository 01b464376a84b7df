"""Round 18: validation's messages state intervals that agree with the word 'finite'."""
import math

import pytest

from sazo_lite.validation import check_number


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, -1.0])
def test_interval_with_an_infinite_end_is_written_open(value):
    with pytest.raises(ValueError) as err:
        check_number("eps", value, 0.0, closed_low=False)
    assert "(0.0, inf)" in str(err.value) and "inf]" not in str(err.value)


def test_infinite_low_end_is_written_open_and_finite_ends_keep_their_brackets():
    with pytest.raises(ValueError) as err:
        check_number("x", math.nan)
    assert "(-inf, inf)" in str(err.value)
    with pytest.raises(ValueError) as err:
        check_number("x", 2.0, 0.0, 1.0)
    assert "[0.0, 1.0]" in str(err.value)
    with pytest.raises(ValueError) as err:
        check_number("x", 1.0, 0.0, 1.0, closed_high=False)
    assert "[0.0, 1.0)" in str(err.value)
