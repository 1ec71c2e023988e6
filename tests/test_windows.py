"""Overlapping windows for sequences longer than the model's window (pmlm.tokens)."""

import numpy as np
import pytest

from pmlm.tokens import WindowMean, window_starts


@pytest.mark.parametrize("length,room", [(1, 4), (4, 4), (5, 4), (23, 10), (25, 10), (1000, 1022)])
def test_windows_cover_every_residue_and_stay_inside(length, room):
    starts = window_starts(length, room)
    covered = np.zeros(length, dtype=int)
    for s in starts:
        assert s >= 0 and s + min(room, length) <= length
        covered[s : s + room] += 1
    assert covered.min() >= 1
    assert starts == sorted(set(starts))


def test_window_starts_default_stride_is_half_a_window_and_last_is_flush():
    assert window_starts(5, 10) == [0]
    assert window_starts(25, 10) == [0, 5, 10, 15]
    assert window_starts(23, 10) == [0, 5, 10, 13]
    assert window_starts(23, 10, stride=10) == [0, 10, 13]
    with pytest.raises(ValueError):
        window_starts(23, 10, stride=11)


def test_window_mean_averages_over_the_windows_that_hold_each_residue():
    rng = np.random.default_rng(0)
    truth = rng.normal(size=(23, 3))
    mean = WindowMean(23, (3,))
    for s in window_starts(23, 10):
        mean.add(s, truth[s : s + 10] + 0.0)  # every window sees the same values
    np.testing.assert_allclose(mean.mean(), truth, rtol=0, atol=1e-12)
    # residue 14 sits in the windows starting at 5, 10 and 13: the mean of those three values
    by_start = WindowMean(23)
    for s in window_starts(23, 10):
        by_start.add(s, np.full(10, float(s)))
    assert by_start.mean()[14] == pytest.approx((5 + 10 + 13) / 3)


def test_pair_window_mean_leaves_pairs_no_window_holds_as_nan():
    mean = WindowMean(23, pairs=True)
    for s in window_starts(23, 10):
        mean.add(s, np.ones((10, 10)))
    out = mean.mean()
    i, j = np.nonzero(np.isnan(out))
    assert (np.abs(i - j) >= 10 // 2).all()  # every pair closer than half a window has a value
    assert not np.isnan(out[0, 9]) and np.isnan(out[0, 22])
