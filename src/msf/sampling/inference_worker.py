"""The inference worker: batches the observations of its rollout workers and runs the policy.

Rollout worker ``w`` is served by inference worker ``w % policy_workers_per_policy``. The
worker waits on the pipes of all its rollout workers at once, takes every request that is
ready (one byte: the split), gathers those envs' observations from the trajectory buffer
in one indexing operation, runs one forward pass, writes actions, log-probabilities,
values and the policy version (with ``--kl_loss_coeff``, also the action distribution's parameters) back
into the buffer, and answers each rollout worker with one message listing the splits it served.
Before each batch it loads the newest weights the learner has published.
"""

from __future__ import annotations

import logging
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any, cast

import numpy as np
import torch

from msf.model.actor_critic import ActorCritic
from msf.runtime.affinity import INFERENCE_NICENESS, raise_niceness
from msf.runtime.spawning import parent_alive
from msf.sampling.plan import DeviceGroup, plan_workers
from msf.sampling.protocol import InferenceWorkerSpec

log = logging.getLogger("msf")


class _RecordingActorCritic(ActorCritic):
    """An :class:`ActorCritic` that keeps the action-head outputs (``[N, P]``) of its last
    :meth:`forward_with_states`, the pass :meth:`~ActorCritic.act` samples from: the behaviour distribution
    that the fixed KL loss needs, stored without a second forward pass."""

    last_params: torch.Tensor | None = None

    def forward_with_states(self, obs, rnn_states=None, dones=None):
        out = super().forward_with_states(obs, rnn_states, dones)
        self.last_params = out[0]
        return out


class InferenceWorker:
    """One inference worker (see module docstring).

    Driven by :meth:`run` in its own process (pipes from its rollout workers), or from outside, in one
    process: :meth:`serve` a list of requests, then tell the rollout workers (see
    ``tests/unit/test_serial_core.py``).

    Args:
        spec: what the worker is given (see :class:`~msf.sampling.protocol.InferenceWorkerSpec`).
    """

    def __init__(self, spec: InferenceWorkerSpec):
        cfg, derived, spaces, buffer = spec.cfg, spec.derived, spec.spaces, spec.buffer
        self.cfg, self.conns, self.weights, self.stop_event = cfg, dict(spec.conns), spec.weights, spec.stop_event
        self.policy = spec.policy
        self.slot_policy = buffer.slot_policy.numpy() if cfg.num_policies > 1 else None
        self.parent_pid, self.stats = spec.parent_pid, spec.counters
        self.device = torch.device(spec.device)
        self.eps = derived.agents_per_split
        self.T = cfg.rollout
        self.obs_flat = buffer.obs.view(-1, *spaces.obs_shape)
        self.actions_flat = buffer.actions.view(-1, *spaces.action_shape)
        self.log_probs_flat = buffer.log_probs.view(-1)
        self.values_flat = buffer.values.view(-1)
        self.versions_flat = buffer.policy_versions.view(-1)
        self.rnn_flat = buffer.rnn_states.view(-1, buffer.rnn_states.shape[-1]) if buffer.rnn_states.shape[-1] else None
        P = buffer.action_params.shape[-1]
        self.params_flat = buffer.action_params.view(-1, P) if P else None
        self.cursors = buffer.cursors.numpy()
        self.model = (_RecordingActorCritic if P else ActorCritic)(cfg, spaces).to(self.device).eval()
        self.version = -1
        self.worker_of = {c: w for w, c in self.conns.items()}
        # --deterministic: one request per forward pass (a batch's composition never depends on timing), and
        # each row's action from a generator of its own, seeded by the seed and the row's job-wide index
        self.deterministic, self.seed = cfg.deterministic, cfg.seed
        self.first_row = spec.first_worker * self.cursors.shape[1]
        self.generators: dict[int, torch.Generator] = {}

    @classmethod
    def in_process(
        cls, cfg: Any, derived: Any, spaces: Any, buffer: Any, weights: Any, policy: int = 0
    ) -> InferenceWorker:
        """Inference worker 0 of ``policy`` (:func:`~msf.sampling.plan.plan_workers`), driven from outside in this
        process (no pipes, no parent to watch, CPU): for :meth:`serve` called directly, by tests and benchmarks.
        ``weights``: every policy's."""
        group = DeviceGroup(buffer, [weights] * cfg.num_policies)
        return cls(plan_workers(cfg, derived, spaces, group, threading.Event()).inference[(policy, 0)])

    def _generators(self, rows: np.ndarray) -> list[torch.Generator]:
        """The action generators of these job-wide rows (made on first use)."""
        out = []
        assert self.seed is not None, "launch.resolve() sets it"
        for r in rows.tolist():
            g = self.generators.get(r)
            if g is None:
                g = self.generators[r] = torch.Generator().manual_seed(self.seed * 1_000_003 + r)
            out.append(g)
        return out

    def _refresh_weights(self) -> None:
        if self.weights.version != self.version:
            self.version = self.weights.load_into(self.model)

    def serve(self, requests: list[tuple[int, int]]) -> None:
        """Load the newest published weights if their version moved, then act for ``requests``.

        Args:
            requests: ``(rollout worker, split)`` pairs. For every row of those splits whose slot is this
                worker's policy's, at its cursor ``(slot, t)``: the action, its log-probability, the value
                and this worker's weights' version at ``[slot, t]``, and the core's next state at
                ``rnn_states[slot, t + 1]`` (with ``--kl_loss_coeff``, the action distribution's parameters at
                ``action_params[slot, t]``). Nothing else in the buffer is written.

        Raises:
            TimeoutError: the published weights stayed torn (see :meth:`PublishedWeights.load_into`).
        """
        self._refresh_weights()
        if self.deterministic:
            for request in requests:
                self._serve([request])
        else:
            self._serve(requests)

    @torch.inference_mode()
    def _serve(self, requests: list[tuple[int, int]]) -> None:
        cur = np.concatenate([self.cursors[w, s * self.eps : (s + 1) * self.eps] for w, s in requests])
        E = self.cursors.shape[1]
        rows = np.concatenate([w * E + np.arange(s * self.eps, (s + 1) * self.eps) for w, s in requests])
        if self.slot_policy is not None:
            mine = self.slot_policy[cur[:, 0]] == self.policy
            cur, rows = cur[mine], rows[mine]
        slots, ts = cur[:, 0], cur[:, 1]
        obs_idx = torch.from_numpy(slots * (self.T + 1) + ts)
        act_idx = torch.from_numpy(slots * self.T + ts)
        obs = self.obs_flat.index_select(0, obs_idx).to(self.device, non_blocking=True)
        states = None if self.rnn_flat is None else self.rnn_flat.index_select(0, obs_idx).to(self.device)
        generators = self._generators(self.first_row + rows) if self.deterministic else None
        if isinstance(self.model, _RecordingActorCritic):  # as self.params_flat is not None
            self.model.last_params = None
        actions, log_probs, values, new_states = self.model.act(obs, states, generators)
        if self.params_flat is not None:
            self.params_flat[act_idx] = self._behaviour_params(len(slots)).to("cpu")
        if new_states is not None:
            # the state before the next step, at the next row (the rollout worker zeros it at an episode end)
            assert self.rnn_flat is not None, "a model with a recurrent core has a buffer with its states"
            self.rnn_flat[obs_idx + 1] = new_states.to("cpu")
        self.actions_flat[act_idx] = actions.to("cpu")
        self.log_probs_flat[act_idx] = log_probs.to("cpu")
        self.values_flat[act_idx] = values.to("cpu")
        self.versions_flat[act_idx] = self.version
        self.stats.add_batch(len(slots))

    def _behaviour_params(self, n: int) -> torch.Tensor:
        """``[n, P]``: the parameters of the distribution :meth:`ActorCritic.act` just sampled from, as
        :meth:`ActorCritic.forward` gives them (logits, or a Gaussian's means then log standard deviations).

        Raises:
            RuntimeError: ``act`` did not go through ``forward_with_states`` once for these ``n`` rows, or
                the parameters do not fit ``TrajectoryBuffer.action_params``.
        """
        assert isinstance(self.model, _RecordingActorCritic) and self.params_flat is not None, "--kl_loss_coeff only"
        params, self.model.last_params = self.model.last_params, None
        if params is None or params.shape[0] != n:
            raise RuntimeError("ActorCritic.act no longer runs forward_with_states once per call")
        if params.shape[-1] != self.params_flat.shape[-1]:
            raise RuntimeError(f"{params.shape[-1]} action parameters, the buffer holds {self.params_flat.shape[-1]}")
        return params

    def run(self) -> None:
        """Serve requests until the stop event is set or the parent process is gone."""
        conns = list(self.conns.values())
        while not self.stop_event.is_set() and parent_alive(self.parent_pid):
            t0 = time.monotonic()
            ready = cast(list[Connection], wait(conns, timeout=0.5))  # items of conns
            self.stats.add_wait(time.monotonic() - t0)
            if not ready:
                continue
            requests = []
            for c in ready:
                w = self.worker_of[c]
                try:
                    while c.poll():
                        requests.append((w, c.recv_bytes()[0]))
                except EOFError:
                    if self.stop_event.is_set():
                        return
                    raise RuntimeError(f"rollout worker {w} closed its pipe") from None
            self.serve(requests)
            # one message per rollout worker, listing its splits: fewer writes, fewer wake-ups
            replies: dict[int, list[int]] = {}
            for w, s in requests:
                replies.setdefault(w, []).append(s)
            for w, splits in replies.items():
                self.conns[w].send_bytes(bytes(splits))


def inference_worker_main(spec: InferenceWorkerSpec) -> None:
    """Process entry point: run an :class:`InferenceWorker` of ``spec``."""
    torch.set_num_threads(1)
    if spec.cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    if spec.cfg.num_workers > 1:
        log.info("inference worker of policy %d runs at niceness %d", spec.policy, raise_niceness(INFERENCE_NICENESS))
    InferenceWorker(spec).run()
