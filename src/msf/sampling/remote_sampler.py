"""A device group's sampler with sampler nodes (``--sampler_port``): its own workers, if any, plus the trajectories
that sampler nodes send (:class:`~msf.sampling.sampler_endpoint.SamplerEndpoint`), behind the one
:class:`~msf.sampling.protocol.Sampler` seam: the training loop and its batcher do not know which is which."""

from __future__ import annotations

import queue
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from msf.sampling.messages import SlotsReturned
from msf.sampling.protocol import ComponentFailed, Outbox, Sampler
from msf.sampling.sampler_endpoint import SamplerEndpoint

# a source's books (agent steps), summed in sampler_nodes' total
_BOOKS = ("sampled", "lost_in_flight", "sent", "received", "rejected", "lost", "kept", "dropped", "pending")
_STEPS = tuple(f"env_steps_{k}" for k in _BOOKS)


class _FreeQueues(Sequence[Outbox[SlotsReturned]]):
    """The batcher's ``free_queues``: rollout worker ``w``'s below ``len(local)``, the endpoint's above (one per
    sampler node, all the same queue: the endpoint knows its slots)."""

    def __init__(self, local: Sequence[Outbox[SlotsReturned]], remote: Outbox[SlotsReturned]):
        self.local, self.remote = local, remote

    def __len__(self) -> int:
        return len(self.local) + 1

    def __getitem__(self, w: Any) -> Any:  # an int: a worker's index
        return self.local[w] if w < len(self.local) else self.remote


class RemoteSampler:
    """A :class:`~msf.sampling.protocol.Sampler`: ``local``'s workers (None: ``--num_workers=0``, the learner
    trains only on what sampler nodes send) and an endpoint for sampler nodes, whose trajectories and episodes
    arrive on the same queues as the local ones.

    Args:
        local: the group's own sampler, or None.
        endpoint: makes the endpoint, given the full queue and the stats queue it announces on.
    """

    receive_timeout_s = 0.05

    def __init__(self, local: Sampler | None, endpoint: Callable[[Any, Any], SamplerEndpoint]):
        self.local = local
        self.full_queue: Any = local.full_queue if local is not None else queue.Queue()
        self.stats_queue: Any = local.stats_queue if local is not None else queue.Queue()
        self.endpoint = endpoint(self.full_queue, self.stats_queue)
        self.free_queues: Sequence[Outbox[SlotsReturned]] = _FreeQueues(
            local.free_queues if local is not None else [], self.endpoint.returned
        )
        self.inference_stats = local.inference_stats if local is not None else []
        self.rollout_wait = local.rollout_wait if local is not None else []
        self.logs_tracebacks = local.logs_tracebacks if local is not None else True
        self.endpoint.note_waiting()

    def advance(self) -> None:
        """Check the local workers, then the endpoint's thread.

        Raises:
            ComponentFailed: the endpoint's thread failed; or what the local sampler raises.
        """
        if self.local is not None:
            self.local.advance()
        if self.endpoint.error is not None:
            raise ComponentFailed(f"sampler endpoint at {self.endpoint.address} failed: {self.endpoint.error!r}")

    def stop(self) -> None:
        """Tell the sampler nodes that the job ends (exit 0 there), and stop the local workers."""
        self.endpoint.finish("ended")
        if self.local is not None:
            self.local.stop()

    def close(self) -> None:
        self.endpoint.finish("failed")  # only if stop() did not come first: a failure
        if self.local is not None:
            self.local.close()

    def sources(self, taken: Mapping[int, int], dropped: Mapping[int, int], rollout: int) -> dict:
        """``summary.json``'s ``sampler_nodes``: how many joined and are connected, the connections refused, and
        per source its books in agent steps: ``sampled = sent + lost_in_flight``, ``sent = rejected + lost +
        received`` and ``received = kept + dropped + pending`` (``sampled``: as the node last reported, at least
        what it sent; ``lost_in_flight``: what the job never heard of being sent, lost with a node that is gone,
        or still on its way at the run's end; ``lost``: gaps in what arrived; ``taken``, ``dropped``: the
        batcher's trajectories by virtual worker; ``kept`` were taken for training, the last of them discarded at
        the run's end as the total's ``env_steps_discarded`` counts; ``pending``: still in the buffer at the
        end); ``joined_at_s`` and ``first_trajectory_at_s``: when it first joined and when its first trajectory
        entered the buffer, in seconds since the endpoint began listening. ``total``: every ``env_steps_`` count
        summed over the sources."""
        e = self.endpoint
        per = {}
        for s in list(e.sources.values()):
            w = e.first_worker + s.index
            t, d = taken.get(w, 0), dropped.get(w, 0)
            sent = max(s.sent, s.received + s.rejected)
            per[s.name] = {
                "connected": not s.left,
                "workers": s.workers,
                "env_steps_sampled": max(s.sampled, sent) * rollout,
                "env_steps_lost_in_flight": max(0, s.sampled - sent) * rollout,
                "env_steps_sent": sent * rollout,
                "env_steps_received": s.received * rollout,
                "env_steps_rejected": s.rejected * rollout,
                "env_steps_lost": max(0, s.sent - s.received - s.rejected) * rollout,
                "env_steps_kept": (t - d) * rollout,
                "env_steps_dropped": d * rollout,
                "env_steps_pending": (s.received - t) * rollout,
                "episodes": s.episodes,
                "policy_lag_mean": s.lag_sum / s.received if s.received else None,
                "bytes_received": s.bytes,
                "weights_sent": s.weights_sent,
                "weights_bytes_sent": s.weights_bytes,
                "joined_at_s": round(s.joined_s, 3),
                "first_trajectory_at_s": None if s.first_trajectory_s is None else round(s.first_trajectory_s, 3),
            }
        return {
            "address": e.address,
            "joined": len(per),
            "connected": len(e.connected()),
            "refused": dict(e.refused),
            "rejected_connections": e.rejected_connections,
            "sources": per,
            "total": {k: sum(v[k] for v in per.values()) for k in _STEPS},
        }

    def status_note(self, taken: Mapping[int, int], dropped: Mapping[int, int], rollout: int) -> str:
        """The status line's part: ``sampler nodes N: steps received, dropped (stale or rejected), lost in flight
        (with the nodes that are gone)``."""
        s = self.sources(taken, dropped, rollout)
        t, gone = s["total"], [v for v in s["sources"].values() if not v["connected"]]
        lost = sum(v["env_steps_lost"] + v["env_steps_lost_in_flight"] for v in gone)
        return (
            f" | sampler nodes {s['connected']}: {t['env_steps_received']} steps received, "
            f"{t['env_steps_dropped'] + t['env_steps_rejected']} dropped, {lost} lost in flight"
        )


def tensorboard_scalars(nodes: dict | None) -> dict[str, float | None]:
    """TensorBoard's points of ``nodes`` (:meth:`RemoteSampler.sources`; None: no sampler nodes, no points):
    ``sampler_nodes/connected``, and per source ``sampler_nodes/NAME/``: agent steps received, dropped (stale) and
    lost in flight, and its trajectories' mean policy lag at arrival (None before the first)."""
    if nodes is None:
        return {}
    scalars: dict[str, float | None] = {"sampler_nodes/connected": nodes["connected"]}
    for name, v in nodes["sources"].items():
        for k in ("env_steps_received", "env_steps_dropped", "env_steps_lost_in_flight", "policy_lag_mean"):
            scalars[f"sampler_nodes/{name}/{k}"] = v[k]
    return scalars
