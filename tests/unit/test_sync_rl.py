"""``--async_rl=False`` (synchronous PPO) and ``--serial_mode``'s sampler, in one process: a real trajectory buffer,
real rollout and inference workers on CartPole-v1 (:class:`SerialSampler`) and the batcher, with the learner
stood in for by publishing new weights; and the validation of the sync mode's flags."""

from __future__ import annotations

import pytest
import torch

from msf.cfg.arguments import parse_args
from msf.cfg.config import Derived
from msf.cfg.validation import ConfigError, check_sync
from msf.envs.registry import env_spaces
from msf.learning.batcher import Batcher
from msf.model.actor_critic import ActorCritic
from msf.sampling.plan import DeviceGroup
from msf.sampling.published_weights import PublishedWeights
from msf.sampling.serial import SerialSampler
from msf.sampling.trajectory_buffer import TrajectoryBuffer


def _cfg(*extra: str):
    cfg, _ = parse_args(
        [
            "--env=CartPole-v1",
            "--num_workers=2",
            "--num_envs_per_worker=4",
            "--worker_num_splits=2",
            "--rollout=8",
            "--batch_size=64",
            "--seed=3",
            "--device=cpu",
            *extra,
        ]
    )
    return cfg


def _setup(cfg):
    derived, spaces = Derived.of(cfg), env_spaces(cfg.env)
    buffer = TrajectoryBuffer.allocate(cfg, derived, spaces)
    model = ActorCritic(cfg, spaces).eval()
    weights = PublishedWeights(model)
    weights.publish(model, 0)
    sampler = SerialSampler(cfg, derived, spaces, DeviceGroup(buffer, [weights]))
    batcher = Batcher(
        buffer,
        sampler.full_queue,
        sampler.free_queues,
        1,
        derived.trajectories_per_iteration,
        cfg.max_policy_lag,
        hold_slots=not cfg.async_rl,
    )
    return derived, buffer, model, weights, sampler, batcher


def _next_batch(sampler, batcher, version, limit=10_000):
    """Advance the sampler until the batcher hands out a batch; the number of rounds it took."""
    for rounds in range(limit):
        sampler.advance()
        batcher.receive(timeout=0.0)
        taken = batcher.take(0, version)
        if taken.batch is not None:
            return taken.batch, rounds
    raise AssertionError("no batch")


def test_sync_mode_trains_each_iteration_on_exactly_its_own_fresh_trajectories():
    """2 workers x 4 envs x rollout 8 = 64 samples per round, batch 128: each env writes 2 trajectories per
    iteration with the weights of the learner's current version, then nothing moves until the learner has
    trained (published) and released the slots: the policy lag of every sample is 0."""
    cfg = _cfg("--async_rl=False", "--batch_size=128")
    derived, buffer, model, weights, sampler, batcher = _setup(cfg)
    assert derived.sync_rollouts == 2 and derived.trajectories_per_iteration == 16
    assert derived.slots_per_worker == 4 * (2 + 1)  # each env: its 2 finished trajectories and the one it writes
    version = 0
    for iteration in range(4):
        batch, _ = _next_batch(sampler, batcher, version)
        assert batch["rewards"].shape == (16, 8)
        # every action of the batch was taken by the weights the learner holds now
        assert (batch["policy_versions"] == version).all(), batch["policy_versions"].unique()
        # 2 trajectories of each of the 8 envs: 8 distinct bootstrap chains, the first trajectories' last
        # observations are the second ones' first observations
        assert batcher.pending(0) == 0 and batcher.ready(0) == 0
        # while the learner trains, the workers wait: nothing is stepped, asked for or announced
        steps_before = buffer.cursors.clone()
        for _ in range(20):
            assert not sampler.advance()
        assert torch.equal(buffer.cursors, steps_before) and sampler.full_queue.empty()
        # the learner's SGD steps publish new weights; then it releases the slots
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * (iteration + 1))
        version += 1
        weights.publish(model, version)
        assert batcher.release(0) == 16
    # the async mode, for contrast, keeps sampling while the learner holds a batch
    cfg = _cfg("--batch_size=128")
    _, buffer, _, _, sampler, batcher = _setup(cfg)
    _next_batch(sampler, batcher, 0)
    assert sampler.advance()


def test_the_first_iteration_waits_for_every_env_of_the_round():
    """The sync gate counts trajectories per split: a batch of exactly one round (64 samples) comes only after
    every split of every worker has written its trajectory, in T rounds of stepping (2 splits: 2T + a few
    request rounds), and the cursors then stand at step 0 of the next trajectory."""
    cfg = _cfg("--async_rl=False")
    derived, buffer, _, _, sampler, batcher = _setup(cfg)
    assert derived.sync_rollouts == 1
    batch, rounds = _next_batch(sampler, batcher, 0)
    assert batch["rewards"].shape == (8, 8)
    assert rounds >= cfg.rollout
    assert (buffer.cursors[:, :, 1] == 0).all()
    assert all(w.quota.all_parked for w in sampler.rollout)


@pytest.mark.parametrize("accumulate", [1, 0])
def test_serial_sampler_puts_a_step_off_while_the_learner_holds_its_slots(accumulate):
    """Async mode, one process: a worker out of free slots does not block (the learner runs in the same
    process); its step waits until the batcher has returned slots, and then goes on. With no spare slots
    (--num_batches_to_accumulate=0) a worker process would wait inside a step for the learner, which the one
    process of --serial_mode cannot: it keeps one spare slot per env, as with 1."""
    cfg = _cfg(f"--num_batches_to_accumulate={accumulate}", "--serial_mode=True")
    derived, buffer, _, _, sampler, batcher = _setup(cfg)
    assert derived.slots_per_worker == 4 * 2
    assert Derived.of(_cfg(f"--num_batches_to_accumulate={accumulate}")).slots_per_worker == 4 * (1 + accumulate)
    for _ in range(200):  # without a learner taking batches, the workers fill every slot and stop
        sampler.advance()
    assert sampler.deferred and not sampler.advance()
    cursors = buffer.cursors.clone()
    batcher.receive(timeout=0.0)
    assert batcher.take(0, 0).batch is not None  # its slots go back to their workers
    assert sampler.advance() and not torch.equal(buffer.cursors, cursors)


def _problems(*args: str, agents: int = 1, nproc: int = 1) -> list[str]:
    try:
        check_sync(_cfg(*args), agents, nproc)
    except ConfigError as e:
        return e.problems
    return []


def test_sync_mode_needs_an_iteration_of_whole_rounds():
    # 2 x 4 x 8 = 64 samples per round
    assert _problems("--async_rl=False") == []
    assert _problems("--async_rl=False", "--batch_size=192") == []
    assert _problems("--async_rl=True", "--batch_size=96") == []
    (line,) = _problems("--async_rl=False", "--batch_size=96")
    assert line.startswith("--async_rl: ") and "= 64 samples" in line and "96" in line
    assert "one rollout of the device group's envs (2 rollout worker(s) x 4 envs" in line
    fit = int(line.split("for example --batch_size=")[1].split()[0])
    assert fit % 64 == 0 and _problems("--async_rl=False", f"--batch_size={fit}") == []
    # an iteration smaller than one round can never be all of a round
    assert _problems("--async_rl=False", "--batch_size=32")
    # two agents per env: 128 samples per round
    assert _problems("--async_rl=False", agents=2)
    assert _problems("--async_rl=False", "--batch_size=128", agents=2) == []
    # 3 workers on 2 device groups: 2 and 1 workers, 64 and 32 samples per round: 64 fits group 0 and 1
    assert _problems("--async_rl=False", "--num_workers=3", nproc=2) == []
    (line,) = _problems("--async_rl=False", "--num_workers=3", "--batch_size=32", nproc=2)
    assert "device group 0" in line


def test_sync_mode_needs_one_policy():
    (line,) = _problems("--async_rl=False", "--num_policies=2")
    assert line.startswith("--async_rl: ") and "--num_policies=1" in line


@pytest.mark.parametrize("flag", ["--async_rl", "--serial_mode"])
def test_the_flags_take_sample_factorys_boolean_spellings(flag):
    assert getattr(_cfg(f"{flag}=False"), flag[2:]) is False
    assert getattr(_cfg(f"{flag}=True"), flag[2:]) is True


def test_reset_ignores_seed_tells_a_seeded_env_from_one_that_is_not():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
    import msf_test_envs  # noqa: F401 - registers the test envs

    from msf.envs.seeding import reset_ignores_seed

    assert not reset_ignores_seed("CartPole-v1")
    assert reset_ignores_seed("MsfUnseededCartPole-v0")


def test_reset_ignores_seed_makes_a_vector_only_env_as_a_vector_env():
    """--deterministic with a name registered only by register_vector_env: checked as the vector env msf steps
    (one env of it), not refused as a name that needs one gymnasium env."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
    import msf_test_envs  # noqa: F401 - registers the test envs

    from msf.envs.seeding import reset_ignores_seed

    # its observation counts the episodes: the second reset's first one is [0, 1, 0, 0], not the first's [0, 0, 0, 0]
    assert reset_ignores_seed("MsfFiveStepSame")


def test_per_row_generators_make_an_action_independent_of_the_batch():
    """--deterministic's sampling: a row's action depends on its own generator only, not on the rows beside it
    in the batch or their number."""
    cfg = _cfg()
    spaces = env_spaces(cfg.env)
    torch.manual_seed(0)
    model = ActorCritic(cfg, spaces).eval()
    obs = torch.randn(6, 4)

    def gens(seeds):
        return [torch.Generator().manual_seed(s) for s in seeds]

    together = torch.stack([model.act(obs, None, gens(range(6)))[0] for _ in range(1)])[0]
    alone = torch.cat([model.act(obs[i : i + 1], None, gens([i]))[0] for i in range(6)])
    assert torch.equal(together, alone)
    reordered = model.act(obs.flip(0), None, gens(reversed(range(6))))[0]
    assert torch.equal(reordered.flip(0), together)
    # and the draws are random: 200 draws of one row cover both CartPole actions
    g = gens([0])
    assert set(model.act(obs[:1].expand(200, 4), None, g * 200)[0].tolist()) == {0, 1}
