"""Two ways a run wastes itself without failing, said while they happen: no batch fills (no SGD step), and most
trajectories are dropped as too old (``--max_policy_lag``). Fed by the training loop once per pass, with this
device group's counts; what it found goes into ``summary.json``'s ``policies`` (:meth:`RunHealth.add_to_summary`)."""

from __future__ import annotations

import collections
import logging

from msf.cfg.config import Config, Derived

log = logging.getLogger("msf")

NO_STEP_FIRST_S = 30.0  # seconds of sampling without an SGD step before the first warning; then 2x, 4x, ...
DROP_WINDOW_S = 60.0  # the window over which the dropped share is measured
DROP_SHARE = 0.5  # a dropped share above this is warned about (once per policy)


class RunHealth:
    """Per policy: the trajectories taken out of the buffer (kept or dropped) and its SGD steps.

    Args:
        cfg, derived: the run's config. train_steps: each policy's SGD steps at the start of this run.
    """

    def __init__(self, cfg: Config, derived: Derived, train_steps: list[int]):
        self.cfg, self.rollout = cfg, cfg.rollout
        self.batch = derived.trajectories_per_iteration * cfg.rollout  # samples one iteration trains on
        self.first_steps = list(train_steps)
        self.trained = [False] * len(train_steps)
        self.kept = [0] * len(train_steps)  # trajectories kept since sampling began
        self.sampling_since: float | None = None  # when every env had started
        self.next_warning = NO_STEP_FIRST_S
        self.window: list[collections.deque[tuple[float, int, int]]] = [collections.deque() for _ in train_steps]
        self.dropped_share: list[float | None] = [None] * len(train_steps)  # the share warned about

    def observe(self, now: float, started: bool, taken: list[tuple[int, int]], train_steps: list[int]) -> None:
        """One pass of the loop: ``taken`` per policy ``(trajectories, of them dropped)``, ``train_steps`` each
        policy's SGD steps now, ``started``: every env of the device group has started. Logs what is due."""
        if self.sampling_since is None and started:
            self.sampling_since = now
        for p, ((n, dropped), steps) in enumerate(zip(taken, train_steps)):
            self.kept[p] += n - dropped
            self.trained[p] = self.trained[p] or steps > self.first_steps[p]
            if n:
                self.window[p].append((now, n, dropped))
            while self.window[p] and self.window[p][0][0] < now - DROP_WINDOW_S:
                self.window[p].popleft()
        if self.sampling_since is not None and now - self.sampling_since >= self.next_warning:
            self.next_warning *= 2
            line = self.no_step_line(now)
            if line:
                log.warning("%s", line)
        for p in range(len(self.window)):
            line = self._dropped_line(p)
            if line:
                log.warning("%s", line)

    def batch_seconds(self, p: int, now: float) -> float | None:
        """Seconds one batch of policy ``p`` takes at the rate its kept samples came in (None: none yet)."""
        if self.sampling_since is None or not self.kept[p]:
            return None
        return self.batch / (self.kept[p] * self.rollout / max(now - self.sampling_since, 1e-9))

    def no_step_line(self, now: float) -> str | None:
        """The warning for the policies with no SGD step yet in this run (None: every one has made one)."""
        if self.sampling_since is None or all(self.trained):
            return None
        parts = []
        for p in (p for p, t in enumerate(self.trained) if not t):
            secs = self.batch_seconds(p, now)
            takes = "no trajectory yet" if secs is None else f"one batch takes about {secs:.0f} s at this rate"
            parts.append(f"policy {p}: {self.kept[p] * self.rollout} of the {self.batch} samples of a batch, {takes}")
        return (
            f"no SGD step after {now - self.sampling_since:.0f} s of sampling: {'; '.join(parts)}. A smaller "
            f"--batch_size (={self.cfg.batch_size}), more envs (--num_workers={self.cfg.num_workers}, "
            f"--num_envs_per_worker={self.cfg.num_envs_per_worker}) or a shorter --rollout (={self.rollout}: "
            "samples arrive a trajectory at a time) fill it sooner"
        )

    def _dropped_line(self, p: int) -> str | None:
        """The warning, once per policy, when more than :data:`DROP_SHARE` of at least two iterations' worth of
        trajectories in the window were dropped as too old."""
        n = sum(t for _, t, _ in self.window[p])
        dropped = sum(d for _, _, d in self.window[p])
        if self.dropped_share[p] is not None or n * self.rollout < 2 * self.batch or dropped <= DROP_SHARE * n:
            return None
        self.dropped_share[p] = share = dropped / n
        cfg = self.cfg
        return (
            f"policy {p}: {100 * share:.0f}% of the trajectories of the last {DROP_WINDOW_S:.0f} s were dropped as "
            f"older than --max_policy_lag={cfg.max_policy_lag} policy versions: a larger --max_policy_lag, fewer "
            f"SGD steps per iteration (--num_epochs={cfg.num_epochs}, --num_batches_per_epoch="
            f"{cfg.num_batches_per_epoch}) or fewer trajectories held for the learner (--num_batches_to_accumulate="
            f"{cfg.num_batches_to_accumulate}) keep more of them"
        )

    def add_to_summary(self, summary: dict, now: float) -> None:
        """Each policy's ``dropped_share_warned`` (the share warned about; None: never) and ``batch_seconds`` (at
        the rate its samples came in) in ``summary["policies"]``."""
        for p, ps in enumerate(summary["policies"].values()):
            ps["dropped_share_warned"] = self.dropped_share[p]
            ps["batch_seconds"] = self.batch_seconds(p, now)

    def untrained(self, train_steps: list[int]) -> bool:
        """No policy made an SGD step in this run (``train_steps``: each policy's now)."""
        return train_steps == self.first_steps
