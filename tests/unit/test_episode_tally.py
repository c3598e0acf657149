"""--deterministic's episode statistics, read from batches in env order, against a per-env replay by hand."""

from __future__ import annotations

import numpy as np
import torch

from msf.runner.episode_tally import EpisodeTally


def _batches(rng: np.random.Generator, rows: int, per_row: int, T: int, n: int):
    """n batches of ``rows x per_row`` trajectories (sorted by key as the Batcher gives them) and, per env row,
    its whole step sequence (rewards, dones) for the replay."""
    steps = {r: ([], []) for r in range(rows)}
    out = []
    count = [0] * rows
    for _ in range(n):
        rew = rng.normal(size=(rows * per_row, T)).astype(np.float32)
        done = (rng.random((rows * per_row, T)) < 0.15).astype(np.uint8)
        keys = []
        for r in range(rows):
            for j in range(per_row):
                i = r * per_row + j
                keys.append((r << 32) | count[r])
                count[r] += 1
                steps[r][0].extend(rew[i].tolist())
                steps[r][1].extend(done[i].tolist())
        out.append(({"rewards": torch.from_numpy(rew), "dones": torch.from_numpy(done)}, torch.tensor(keys)))
    return out, steps


def test_episodes_come_out_per_batch_in_the_order_they_ended_with_returns_carried_across_batches():
    rng = np.random.default_rng(3)
    rows, per_row, T, n = 3, 2, 5, 4
    batches, steps = _batches(rng, rows, per_row, T, n)
    tally = EpisodeTally()
    got = [tally.add(b, k) for b, k in batches]
    # the replay: each env row's steps one after the other; an episode belongs to the batch its last step is in,
    # and within a batch the episodes are in the order they ended (step, then row)
    span = per_row * T
    for b in range(n):
        want = []
        for r in range(rows):
            rew, done = steps[r]
            start = 0
            for t in range(len(rew)):
                if done[t]:
                    if b * span <= t < (b + 1) * span:
                        want.append((t - b * span, r, sum(float(x) for x in rew[start : t + 1]), t + 1 - start))
                    start = t + 1
        want.sort(key=lambda e: (e[0], e[1]))
        assert got[b][1] == [e[3] for e in want]
        np.testing.assert_allclose(got[b][0], [e[2] for e in want], rtol=1e-12)
    assert sum(len(g[0]) for g in got) > 10  # the test saw episodes, several across batches


def test_an_episode_longer_than_a_batch_is_one_episode():
    tally = EpisodeTally()
    ones = torch.ones(1, 4)
    key = torch.tensor([7 << 32])
    assert tally.add({"rewards": ones, "dones": torch.zeros(1, 4, dtype=torch.uint8)}, key) == ([], [])
    end = torch.tensor([[0, 1, 0, 0]], dtype=torch.uint8)
    assert tally.add({"rewards": ones * 2, "dones": end}, key + 1) == ([4.0 + 4.0], [6])


def test_the_newest_episodes_are_last_whatever_their_env_row():
    # 8 rows, rollout 4, each ends an episode at t=1 and t=3 with reward = row: the t=3 ends of every row come
    # after all the t=1 ends, so a window of the last 8 holds every row's newest episode
    rew = torch.arange(8, dtype=torch.float32)[:, None].expand(8, 4).contiguous()
    done = torch.tensor([[0, 1, 0, 1]] * 8, dtype=torch.uint8)
    keys = torch.arange(8, dtype=torch.int64) << 32
    returns, lengths = EpisodeTally().add({"rewards": rew, "dones": done}, keys)
    assert returns == [2.0 * r for r in range(8)] * 2 and lengths == [2] * 16
