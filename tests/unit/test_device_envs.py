"""Device-side envs: the torch CartPole against gymnasium's, the DeviceSampler's buffer, announcements and episodes
against a hand count, its one-line failures, and the flags' rules (msf.envs.device_env.resolve_device_env)."""

from __future__ import annotations

import dataclasses
import queue

import gymnasium as gym
import numpy as np
import pytest
import torch

from msf.cfg.config import Config, Derived
from msf.cfg.validation import ConfigError
from msf.envs.device_env import device_env_entry, device_env_spaces, register_device_env, resolve_device_env
from msf.envs.torch_cartpole import TorchCartPole
from msf.learning.batcher import Batcher
from msf.sampling.device_sampler import DeviceSampler
from msf.sampling.plan import DeviceGroup
from msf.sampling.protocol import ComponentFailed
from msf.sampling.trajectory_buffer import TrajectoryBuffer

from .conftest import make_learner, tiny_config


def test_torch_cartpole_steps_as_gymnasiums_cartpole_v1():
    """Every instance started from gymnasium's own reset state and driven by the same random actions: the same
    observations (float32), rewards, terminations and truncations as gymnasium's CartPole-v1, autoreset included."""
    n, rng = 6, np.random.default_rng(0)
    envs = [gym.make("CartPole-v1") for _ in range(n)]
    firsts = np.stack([e.reset(seed=i)[0] for i, e in enumerate(envs)])
    tc = TorchCartPole(n, "cpu", seed=0)
    tc.reset()
    tc.state = torch.from_numpy(np.stack([e.unwrapped.state for e in envs]).astype(np.float64))
    assert np.array_equal(tc.state.float().numpy(), firsts)
    ends = truncations = 0
    for _ in range(700):
        actions = rng.integers(0, 2, n)
        obs, rew, term, trunc = tc.step(torch.from_numpy(actions))
        for i, e in enumerate(envs):
            o, r, te, tr, _ = e.step(int(actions[i]))
            assert (r, te, tr) == (float(rew[i]), bool(term[i]), bool(trunc[i]))
            if te or tr:  # both reset: gymnasium's to our fresh state, so the two go on together
                ends += 1
                truncations += tr
                e.reset()
                e.unwrapped.state = tc.state[i].numpy().copy()
                assert tc.elapsed[i] == 0 and np.abs(tc.state[i].numpy()).max() <= 0.05
            else:
                np.testing.assert_allclose(obs[i].numpy(), o, rtol=0, atol=1e-6)
    assert ends > 30  # random actions end an episode within ~20 steps


def test_torch_cartpole_truncates_at_500_steps_and_is_seeded():
    a, b = TorchCartPole(3, "cpu", seed=5), TorchCartPole(3, "cpu", seed=5)
    assert torch.equal(a.reset(), b.reset()) and not torch.equal(a.reset(), TorchCartPole(3, seed=6).reset())
    a.reset()
    for t in range(1, 501):
        a.state.zero_()  # balanced: only the time limit ends the episode
        _, _, term, trunc = a.step(torch.zeros(3, dtype=torch.int64))
        assert not term.any() and bool(trunc.all()) == (t == 500)


class Countdown:
    """A device env whose instance ``i`` has episodes of ``i + 2`` steps, reward = the step's index within the
    episode (1, 2, ...), observations ``[step, i]``; ``bad`` ``{vector step: (field, value)}`` spoils a step."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, num_envs, device, seed, env_config, bad=None):
        self.num_envs, self.device, self.bad, self.calls = num_envs, torch.device(device), bad or {}, 0
        self.t = torch.zeros(num_envs)
        self.length = torch.arange(num_envs, dtype=torch.float32) + 2

    def _obs(self):
        return torch.stack([self.t, torch.arange(self.num_envs, dtype=torch.float32)], 1)

    def reset(self):
        return self._obs()

    def step(self, actions):
        self.calls += 1
        self.t += 1
        rew = self.t.clone()
        term = self.t >= self.length
        self.t[term] = 0
        obs = self._obs()
        field, value = self.bad.get(self.calls, (None, None))
        if field == "obs":
            obs[1, 0] = value
        elif field == "reward":
            rew[1] = value
        elif field == "device":
            obs = obs.to("meta")
        elif field == "float_term":
            term = term.float()
        return obs, rew, term, torch.zeros_like(term)

    def close(self):
        pass


def _sampler(bad=None, **changes):
    register_device_env("countdown", Countdown, Countdown.observation_space, Countdown.action_space)
    if bad:
        register_device_env(
            "countdown_bad", lambda *a: Countdown(*a, bad=bad), Countdown.observation_space, Countdown.action_space
        )
    cfg = tiny_config(env="countdown_bad" if bad else "countdown", num_envs_per_worker=3, worker_num_splits=1)
    cfg = dataclasses.replace(cfg, seed=1, **changes)
    spaces = device_env_spaces(device_env_entry(cfg.env))
    derived = Derived.of(cfg)
    buffer = TrajectoryBuffer.allocate(cfg, derived, spaces, "cpu")
    learner = make_learner(cfg, spaces, seed=0)
    return DeviceSampler(cfg, derived, spaces, DeviceGroup(buffer, [], device="cpu"), [learner]), buffer, learner


def test_the_device_sampler_writes_whole_rollouts_and_counts_episodes_by_hand():
    """3 instances with episodes of 2, 3, 4 steps, rollouts of 4: after 2 rollouts (8 steps) instance i has ended
    8 // (i + 2) episodes, of return 1 + ... + (i + 2); each slot holds its rollout's steps."""
    sampler, buffer, learner = _sampler()
    assert sampler.advance() and sampler.advance()
    first, second = sampler.full_queue.get_nowait(), sampler.full_queue.get_nowait()
    assert (first.worker, len(first.slots), len(second.slots)) == (0, 3, 3) and not set(first.slots) & set(second.slots)
    assert not sampler.advance()  # 6 slots of 6 written: the learner holds them all
    stats = sampler.stats_queue.get_nowait(), sampler.stats_queue.get_nowait()
    episodes = sorted(zip(sum((s.returns for s in stats), []), sum((s.lengths for s in stats), [])))
    want = sorted((float(sum(range(1, i + 3))), i + 2) for i in range(3) for _ in range(8 // (i + 2)))
    assert episodes == want
    for r, slots in enumerate((first.slots, second.slots)):
        for i, s in enumerate(slots):
            steps = [(4 * r + t) % (i + 2) + 1 for t in range(4)]  # the episode step each t of the rollout makes
            assert buffer.rewards[s].tolist() == steps
            assert buffer.dones[s].tolist() == [int(k == i + 2) for k in steps]
            assert buffer.obs[s, :, 0].tolist() == [(4 * r + t) % (i + 2) for t in range(5)]  # row T: the bootstrap
            assert buffer.obs[s, :, 1].tolist() == [i] * 5
            assert int(buffer.slot_key[s]) == (i << 32) + r and int(buffer.slot_policy[s]) == 0
    assert buffer.policy_versions[first.slots].unique().tolist() == [learner.policy_version]
    # the learner's batcher copies them out and gives the slots back; then the sampler writes again
    batcher = Batcher(buffer, sampler.full_queue, sampler.free_queues, 1, 3, max_policy_lag=100)
    sampler.full_queue.put(first), sampler.full_queue.put(second)
    batcher.receive(0.0)
    taken = batcher.take(0, learner.policy_version)
    assert taken.batch is not None and taken.batch["rewards"].shape == (3, 4)
    assert sampler.advance() and sampler.rollout_wait[0].steps == 12


@pytest.mark.parametrize(
    "bad, line",
    [
        (
            {6: ("obs", float("nan"))},
            "countdown_bad returned a non-finite observation (nan) for env 1 at episode step 3",
        ),
        ({2: ("reward", float("inf"))}, "countdown_bad returned a non-finite reward (inf) for env 1 at episode step 2"),
        ({3: ("device", 0)}, "countdown_bad returned its observations on meta, not on its device group's cpu"),
        ({2: ("float_term", 0)}, "countdown_bad returned its terminated flags as torch.float32, not torch.bool"),
    ],
)
def test_a_bad_step_fails_in_one_line_naming_env_group_and_step(bad, line):
    sampler, buffer, _ = _sampler(bad=bad)
    step = next(iter(bad))
    with pytest.raises(ComponentFailed) as e:
        for _ in range(3):
            sampler.advance()
    assert str(e.value) == f"{line}, on device group 0, at vector step {step}"
    assert not sampler.logs_tracebacks and len(str(e.value).splitlines()) == 1
    with pytest.raises(queue.Empty):  # the rollout with the bad step was never announced
        for _ in range(step // 4 + 1):
            sampler.full_queue.get_nowait()


def _resolve(nproc=1, given=(), **flags) -> Config:
    cfg = Config(**flags)
    return resolve_device_env(cfg, set(given) | set(flags), nproc)


def test_the_device_env_flags_rules():
    cfg = _resolve(nproc=2, env="torch_cartpole", env_gpu_actions=True, num_envs_per_worker=1024)
    assert (cfg.num_workers, cfg.worker_num_splits) == (2, 1)  # one vector env per device group
    assert _resolve(env="CartPole-v1").num_workers == Config().num_workers  # a CPU env: nothing changes
    refusals = {
        "--env_gpu_actions: torch_cartpole is a device-side env": dict(env="torch_cartpole"),
        "--env_gpu_observations: torch_cartpole": dict(
            env="torch_cartpole", env_gpu_actions=True, env_gpu_observations=False
        ),
        "--env_gpu_actions: True needs an env registered with msf.envs.register_device_env; CartPole-v1": dict(
            env="CartPole-v1", env_gpu_actions=True
        ),
        "--actor_worker_gpus: msf's rollout workers step CPU envs": dict(actor_worker_gpus=[0]),
        "--num_workers: torch_cartpole": dict(env="torch_cartpole", env_gpu_actions=True, num_workers=4),
        "--num_policies: torch_cartpole": dict(env="torch_cartpole", env_gpu_actions=True, num_policies=2),
        "--worker_num_splits: torch_cartpole": dict(env="torch_cartpole", env_gpu_actions=True, worker_num_splits=2),
        "--env_backend: torch_cartpole": dict(env="torch_cartpole", env_gpu_actions=True, env_backend="envpool"),
        "--sampler_port: torch_cartpole": dict(env="torch_cartpole", env_gpu_actions=True, sampler_port=29600),
    }
    for start, flags in refusals.items():
        with pytest.raises(ConfigError) as e:
            _resolve(**flags)
        assert str(e.value).startswith(start) and len(e.value.problems) == 1, str(e.value)


def test_a_device_env_factory_that_raises_is_named_in_one_line_as_a_cpu_envs_maker_is():
    """The factory is the user's code (a simulator without its licence, a missing GPU): the line names the env, the
    exception and where it was raised, as for a CPU env's maker, not the exception's text alone."""
    from msf.envs.device_env import make_device_env

    def no_licence(num_envs, device, seed, env_config):
        raise RuntimeError("simulator licence not found")

    register_device_env("unlicensed_sim", no_licence, Countdown.observation_space, Countdown.action_space)
    cfg = tiny_config(env="unlicensed_sim")
    with pytest.raises(ConfigError) as e:
        make_device_env(cfg, 4, torch.device("cpu"), 0, {})
    line = "--env=unlicensed_sim: making the env raised RuntimeError: simulator licence not found (test_device_envs.py:"
    assert str(e.value).startswith(line) and str(e.value).endswith(", in no_licence)"), str(e.value)
    assert isinstance(e.value.__cause__, RuntimeError)


def test_a_device_env_experiment_resumes_on_more_device_groups(tmp_path):
    """Its config.json holds --num_workers=1 (msf's, one per device group); resumed with --nproc_per_node=2 it was
    refused as "--num_workers: must be at least nproc_per_node=2 (every device group needs a rollout worker)"."""
    from msf.cfg.arguments import parse_args
    from msf.runner.experiment import prepare_experiment_dir
    from msf.train import prepare

    flags = [
        "--env=torch_cartpole",
        "--env_gpu_actions=True",
        "--device=cpu",
        "--experiment=d",
        f"--train_dir={tmp_path}",
    ]
    first = prepare(*parse_args(flags))[0]
    assert (first.nproc_per_node, first.num_workers) == (1, 1)
    prepare_experiment_dir(first)  # its config.json, as msf-train writes it
    resumed = [*flags, "--restart_behavior=resume", "--nproc_per_node=2", "--train_for_env_steps=2000"]
    cfg = prepare(*parse_args(resumed))[0]  # a flag changed: the config is validated again
    assert (cfg.nproc_per_node, cfg.num_workers) == (2, 2)
