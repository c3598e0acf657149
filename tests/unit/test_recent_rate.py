"""The status line's "fps (10 s)": a count that rises in jumps, read right after each jump."""

import numpy as np
import pytest

from msf.persistence.summaries import RecentRate


def test_jumps_read_right_after_each_jump_give_the_true_rate():
    # an iteration of 4,096 frames every 4 s (1,024 frames/s), read at each jump as the status line is
    r = RecentRate(0.0, 0)
    readings = []
    for k in range(1, 20):
        t, c = 4.0 * k, 4096 * k
        r.note(t, c)
        readings.append(r.rate(t, c))
    # once the window holds whole iterations: 3 jumps over 12 s (the newest jump >= 10 s old is 12 s back)
    assert readings[5:] == pytest.approx([1024.0] * len(readings[5:]), rel=1e-12)
    # what "count gained since now-10 s, over 10 s" would say: 3 jumps in (t-10, t] -> 1,228.8, 20% high
    assert 3 * 4096 / 10.0 == pytest.approx(1228.8)


def test_irregular_jumps_rate_is_count_over_the_span_of_whole_jumps():
    rng = np.random.default_rng(0)
    times = np.cumsum(rng.uniform(0.5, 3.0, size=60))
    sizes = rng.integers(100, 1000, size=60)
    counts = np.cumsum(sizes)
    r = RecentRate(0.0, 0)
    for i, (t, c) in enumerate(zip(times, counts)):
        r.note(float(t), int(c))
        got = r.rate(float(t), int(c))
        # reference: the newest earlier jump at least 10 s before t (or the start)
        older = [j for j in range(i) if t - times[j] >= 10.0]
        t0, c0 = (times[older[-1]], counts[older[-1]]) if older else (0.0, 0)
        assert got == pytest.approx((c - c0) / (t - t0), rel=1e-12)


def test_a_stall_longer_than_the_window_reads_zero_and_no_time_reads_zero():
    r = RecentRate(0.0, 0)
    assert r.rate(0.0, 0) == 0.0
    r.note(2.0, 500)
    assert r.rate(2.0, 500) == pytest.approx(250.0)
    assert r.rate(11.0, 500) == pytest.approx(500 / 11.0)  # still within the window: slowing down
    assert r.rate(12.5, 500) == 0.0  # 10.5 s without a jump
