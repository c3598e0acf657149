"""``--env_backend=vector``: one gymnasium ``VectorEnv`` per split, in every autoreset mode, against hand counts.

The test env (``msf_test_envs.FiveStepVectorEnv``) has 5-step episodes whose ``k``-th step earns ``k`` (return 15);
its observation says which env, episode and step it is, so every row of the trajectory buffer can be checked to be
one real transition."""

from __future__ import annotations

import queue
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
import msf_test_envs  # noqa: E402 - registers the test envs

from msf.cfg.arguments import parse_args  # noqa: E402
from msf.cfg.config import Config, Derived  # noqa: E402
from msf.cfg.validation import ConfigError  # noqa: E402
from msf.envs.registry import env_spaces  # noqa: E402
from msf.envs.vector import VectorSplit, check_backend, make_split  # noqa: E402
from msf.model.actor_critic import ActorCritic  # noqa: E402
from msf.runtime.spawning import OneLineFailure  # noqa: E402
from msf.sampling.messages import SlotsReturned  # noqa: E402
from msf.sampling.plan import DeviceGroup  # noqa: E402
from msf.sampling.published_weights import PublishedWeights  # noqa: E402
from msf.sampling.serial import SerialSampler  # noqa: E402
from msf.sampling.trajectory_buffer import TrajectoryBuffer  # noqa: E402

MODES = {"next_step": "MsfFiveStepNext", "same_step": "MsfFiveStepSame", "disabled": "MsfFiveStepDisabled"}


@pytest.mark.parametrize("mode", MODES)
def test_the_split_returns_the_next_episodes_first_observation_with_the_end(mode):
    """Two envs (global 6 and 7) stepped 12 times by hand: observation, reward, ends and autoreset rows per step."""
    split = make_split(Config(env=MODES[mode], env_backend="vector"), 0, [6, 7], seed=0)
    assert isinstance(split, VectorSplit)
    np.testing.assert_array_equal(split.reset(), [[6, 0, 0, 0], [7, 0, 0, 0]])
    lazy = mode == "next_step"  # CartPoleVectorEnv-like: no masked reset, the first observation comes a step late
    episode, k = 0, 0  # of both envs, which run in step
    for step in range(12):
        obs, rew, term, trunc = split.step(np.array([step % 3, 1]))
        assert rew.dtype == np.float32 and term.dtype == trunc.dtype == np.bool_
        if lazy and k == 5:  # the reset step: no transition
            episode, k = episode + 1, 0
            np.testing.assert_array_equal(split.autoreset_rows, [True, True])
            np.testing.assert_array_equal(obs, [[6, episode, 0, 0], [7, episode, 0, 0]])
            assert rew.tolist() == [0, 0] and not term.any() and not trunc.any()
            continue
        assert split.autoreset_rows is None
        k += 1
        assert rew.tolist() == [k, k]
        assert term.tolist() == [k == 5, False] and trunc.tolist() == [False, k == 5]  # env 7 (odd): truncated
        if k == 5 and not lazy:
            episode, k = episode + 1, 0
        np.testing.assert_array_equal(obs, [[6, episode, k, 0], [7, episode, k, 0]])  # lazy: the final one
    env = split.env
    assert env.autoresets == (2 * 2 if lazy else 0)  # two episode ends per env in 12 steps
    split.close()


def _serial(env: str, envs: int = 6, T: int = 4):
    cfg, _ = parse_args(
        [
            f"--env={env}",
            "--env_backend=vector",
            "--num_workers=1",
            f"--num_envs_per_worker={envs}",
            "--worker_num_splits=2",
            f"--rollout={T}",
            "--seed=1",
            "--device=cpu",
        ]
    )
    derived, spaces = Derived.of(cfg), env_spaces(cfg.env)
    buffer = TrajectoryBuffer.allocate(cfg, derived, spaces)
    torch.manual_seed(0)
    model = ActorCritic(cfg, spaces).eval()
    weights = PublishedWeights(model)
    weights.publish(model, 1)
    return SerialSampler(cfg, derived, spaces, DeviceGroup(buffer, [weights])), buffer


@pytest.mark.parametrize("mode", MODES)
def test_every_row_the_learner_gets_is_a_real_transition_and_episodes_are_exact(mode):
    """The production wiring in one process (rollout and inference workers, trajectory buffer) over 6 envs in 2
    splits for 60 rounds, the slots given back as the learner would: every row of every announced trajectory is
    one transition the env made, with the action it was made with, each exactly once; the reset steps of next-step
    autoreset are in none; every episode reported returns 15 in 5 steps."""
    T = 4
    sampler, buffer = _serial(MODES[mode], T=T)
    seen: list[tuple[int, int, int, int]] = []
    stats = []
    for _ in range(60):
        sampler.advance()
        while True:
            try:
                msg = sampler.full_queue.get_nowait()
            except queue.Empty:
                break
            for s in msg.slots:
                obs, rew = buffer.obs[s].numpy(), buffer.rewards[s].numpy()
                dones, time_outs, actions = buffer.dones[s].numpy(), buffer.time_outs[s].numpy(), buffer.actions[s]
                for t in range(T):
                    e, ep, k = (int(x) for x in obs[t, :3])
                    assert rew[t] == k + 1 and bool(dones[t]) == (k + 1 == 5), (s, t, obs[t], rew[t], dones[t])
                    assert bool(time_outs[t]) == (k + 1 == 5 and e % 2 == 1)
                    following = [e, ep + 1, 0] if k + 1 == 5 else [e, ep, k + 1]
                    if k + 1 == 5 and t == T - 1 and mode == "next_step":
                        # the bootstrap row after an end is the placeholder (the final observation): its value is
                        # masked by the done, and it is in no statistics; the next slot starts with the first
                        following = [e, ep, 5]
                    np.testing.assert_array_equal(obs[t + 1, :3], following)
                    seen.append((e, ep, k, int(actions[t])))
            sampler.free_queues[0].put(SlotsReturned(list(msg.slots)))
        try:
            while True:
                stats.append(sampler.stats_queue.get_nowait())
        except queue.Empty:
            pass
    sampler.rollout[0].report_stats(float("inf"), period_s=0.0)  # the episodes not reported yet, if any
    while not sampler.stats_queue.empty():
        stats.append(sampler.stats_queue.get_nowait())
    envs = [split.env for split in sampler.rollout[0].splits]
    taken = [x for env in envs for x in env.taken]
    assert len(seen) == len(set(seen)) > 6 * 40  # each transition once; most rounds reached a trajectory
    assert set(seen) <= set(taken)  # with the action the env was stepped with
    # the rest are the transitions after each row's last announced trajectory: at most T - 1 + 1 per row
    assert len(taken) - len(seen) <= 6 * T
    returns = [r for m in stats for r in m.returns]
    lengths = [n for m in stats for n in m.lengths]
    ended = sum(1 for e, ep, k, a in taken if k == 4)
    assert returns == [15.0] * ended and lengths == [5] * ended
    # the env's steps: a transition or (next-step) a reset step, never both; each split step steps every env
    split_steps = sampler.rollout_wait[0].steps
    assert 3 * split_steps == len(taken) + sum(env.autoresets for env in envs)
    # next-step: one reset step per episode end, but those still due (the rows whose last step ended)
    due = sum(int(split.pending.sum()) for split in sampler.rollout[0].splits)
    assert sum(env.autoresets for env in envs) == (ended - due if mode == "next_step" else 0)
    sampler.close()


def test_spaces_other_than_declared_fail_in_one_line():
    with pytest.raises(OneLineFailure) as e:
        make_split(Config(env="MsfFiveStepMisdeclared", env_backend="vector"), 3, [12, 13], seed=0)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith("MsfFiveStepMisdeclared: the vector env has other spaces than were declared")
    assert str(e.value).endswith("(rollout worker 3, envs 12..13, at its creation)")
    cfg = Config(env="MsfFiveStepMisdeclared", env_backend="vector")
    with pytest.raises(ConfigError, match=r"^--env_backend=vector: MsfFiveStepMisdeclared: the vector env has other"):
        check_backend(cfg, env_spaces(cfg.env))


def test_observations_of_another_shape_fail_in_one_line_naming_the_step():
    class Wrong(msf_test_envs.FiveStepVectorEnv):
        def step(self, actions):
            obs, *rest = super().step(actions)
            return (obs[:, :3] if self.t[0] == 3 else obs), *rest

    split = VectorSplit(Wrong(2), "wrong", 5, [10, 11], seed=0)
    split.reset()
    split.step(np.zeros(2, dtype=np.int64))
    split.step(np.zeros(2, dtype=np.int64))
    with pytest.raises(OneLineFailure) as e:
        split.step(np.zeros(2, dtype=np.int64))
    assert str(e.value) == (
        "wrong returned observations of shape (2, 3), not (2, 4) as its single_observation_space says, on rollout "
        "worker 5, envs 10..11, at step 3"
    )


def test_a_gymnasium_id_without_a_vector_entry_point_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"^--env_backend=vector: 'FrozenLake-v1' is neither a gymnasium id with"):
        make_split(Config(env="FrozenLake-v1", env_backend="vector"), 0, [0], seed=0)


def test_cartpoles_vector_env_matches_gymnasiums_single_env_spaces_and_limit():
    """``CartPole-v1``'s native ``CartPoleVectorEnv`` (next-step autoreset, no masked reset): same spaces as the
    single env, and a balanced pole truncated at step 500, its end returned with a fresh first observation
    (gymnasium's reset: every component in [-0.05, 0.05]) one step late."""
    cfg = Config(env="CartPole-v1", env_backend="vector")
    check_backend(cfg, env_spaces(cfg.env))
    split = make_split(cfg, 0, [0, 1], seed=5)
    assert split.lazy and type(split.env.unwrapped).__name__ == "CartPoleVectorEnv"
    obs = split.reset()
    lengths, ends, skipped = np.zeros(2, dtype=int), [], 0
    for _ in range(1200):
        balance = int(obs[0, 2] + 0.5 * obs[0, 3] + 0.05 * obs[0, 0] + 0.1 * obs[0, 1] > 0)
        obs, rew, term, trunc = split.step(np.array([balance, 1]))
        fresh = np.zeros(2, dtype=bool) if split.autoreset_rows is None else split.autoreset_rows
        skipped += int(fresh.sum())
        assert rew.tolist() == [0.0 if f else 1.0 for f in fresh]
        assert all(np.all(np.abs(obs[i]) <= 0.05) for i in np.nonzero(fresh)[0])
        lengths += ~fresh
        for i in np.nonzero(term | trunc)[0]:
            ends.append((int(i), int(lengths[i]), bool(term[i]), bool(trunc[i])))
            lengths[i] = 0
    assert [e for e in ends if e[0] == 0] == [(0, 500, False, True), (0, 500, False, True)]
    fallen = [e for e in ends if e[0] == 1]
    assert len(fallen) > 50 and all(term and not trunc and 5 <= n <= 20 for _, n, term, trunc in fallen)
    assert skipped == len(ends) - int(bool(term[1] or trunc[1]))  # one reset step per end (but a last one)
    split.close()


def test_a_sync_vector_env_in_next_step_mode_resets_at_once_with_a_mask():
    """gymnasium's ``SyncVectorEnv`` (next-step by default) resets its ended envs by a masked reset: no reset step,
    no row without a transition; the first observation after an end is CartPole's reset one."""
    venv = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(3)])
    split = VectorSplit(venv, "CartPole-v1", 0, [0, 1, 2], seed=0)
    assert not split.lazy
    split.reset()
    ends = 0
    for _ in range(200):
        obs, rew, term, trunc = split.step(np.ones(3, dtype=np.int64))  # always right: falls in ~10 steps
        assert split.autoreset_rows is None and rew.tolist() == [1.0, 1.0, 1.0]
        for i in np.nonzero(term | trunc)[0]:
            assert np.all(np.abs(obs[i]) <= 0.05)
            ends += 1
    assert ends > 30
    split.close()


def test_batched_sampling_with_the_vector_backend_given_keeps_it():
    from msf.cfg.validation import resolve_sample_factory_flags

    cfg = Config(env="CartPole-v1", batched_sampling=True, env_backend="vector")
    assert resolve_sample_factory_flags(cfg, {"batched_sampling", "env_backend"}).env_backend == "vector"
    assert resolve_sample_factory_flags(cfg, {"batched_sampling"}).env_backend == "envpool"  # Sample Factory's


class NanRewardVectorEnv(msf_test_envs.FiveStepVectorEnv):
    """Env ``first + 1``'s reward is NaN at the 3rd step of its second episode."""

    def step(self, actions):
        obs, rew, term, trunc, info = super().step(actions)
        if self.episode[1] == 1 and self.t[1] == 3:
            rew[1] = np.nan
        return obs, rew, term, trunc, info


def make_nan_reward(name, num_envs, env_config):
    return NanRewardVectorEnv(num_envs, env_config["env_index"], "NextStep")


def test_a_non_finite_reward_of_a_vector_env_fails_in_one_line_naming_env_worker_and_step():
    """The rollout worker's own check (the one every backend goes through), after a next-step reset step: the
    episode step counts transitions only."""
    from msf.envs.registry import register_vector_env

    register_vector_env("MsfNanVector", make_nan_reward)
    sampler, _ = _serial("MsfNanVector")
    with pytest.raises(OneLineFailure) as e:
        for _ in range(40):
            sampler.advance()
            while not sampler.full_queue.empty():
                msg = sampler.full_queue.get_nowait()
                sampler.free_queues[0].put(SlotsReturned(list(msg.slots)))
    sampler.close()
    assert (
        str(e.value) == "MsfNanVector returned a non-finite reward (nan) on rollout worker 0, env 1, at episode step 3"
    )


def test_an_env_registered_only_as_a_vector_env_is_refused_before_the_workers_with_the_gymnasium_backend(tmp_path):
    """With its spaces declared, nothing made one env before the workers: each rollout worker then failed with
    "'X' is not registered ...; nearest registered names: 'X'". The gymnasium backend makes one env at a time."""
    from msf.cfg.arguments import parse_args
    from msf.cfg.validation import ConfigError
    from msf.envs.registry import declare_spaces, make_env, register_vector_env
    from msf.train import prepare

    register_vector_env("MsfVectorOnly", make_nan_reward)
    declare_spaces("MsfVectorOnly", *_nan_reward_spaces())
    line = (
        "--env_backend: 'MsfVectorOnly' is registered only as a vector env (msf.envs.register_vector_env) and this "
        "needs one env: train it with --env_backend=vector, or register one env with msf.envs.register_env too"
    )
    with pytest.raises(ConfigError) as e:
        make_env("MsfVectorOnly", {"env_index": 0})
    assert str(e.value) == line
    argv = ["--env=MsfVectorOnly", "--device=cpu", "--num_workers=1", f"--train_dir={tmp_path}"]
    with pytest.raises(ConfigError) as e:
        prepare(*parse_args(argv))
    assert str(e.value) == line
    cfg = prepare(*parse_args([*argv, "--env_backend=vector"]))[0]  # the vector backend takes it
    assert cfg.env_backend == "vector"


def _nan_reward_spaces() -> tuple[gym.Space, gym.Space]:
    venv = make_nan_reward("MsfVectorOnly", 1, {"env_index": 0})
    return venv.single_observation_space, venv.single_action_space


class DictObservationVectorEnv(msf_test_envs.FiveStepVectorEnv):
    """The five-step env with its observation in a ``Dict``."""

    def __init__(self, num_envs: int, first: int = 0):
        super().__init__(num_envs, first, "SameStep")
        self.single_observation_space = gym.spaces.Dict({"state": self.single_observation_space})


def test_a_vector_env_with_dict_observations_is_refused_in_one_line_before_the_workers(tmp_path):
    """A vector env's observations must be one Box: a Dict was refused as "not supported (supported: Box, Dict of
    Box and Discrete)", which names it as supported."""
    from msf.cfg.arguments import parse_args
    from msf.cfg.validation import ConfigError
    from msf.envs.registry import register_vector_env
    from msf.train import prepare

    register_vector_env("MsfDictVector", lambda name, n, env_config: DictObservationVectorEnv(n))
    argv = ["--env=MsfDictVector", "--env_backend=vector", "--device=cpu", "--num_workers=1", f"--train_dir={tmp_path}"]
    with pytest.raises(ConfigError) as e:
        prepare(*parse_args(argv))
    assert str(e.value) == (
        "--env_backend=vector: MsfDictVector's vector env has the observation space Dict('state': Box(-1.0, "
        "1e+06, (4,), float32)), and a vector env's must be a Box: flatten it in the env, or register one env "
        "with msf.envs.register_env and use --env_backend=gymnasium"
    )


class RaisingVectorEnv(msf_test_envs.FiveStepVectorEnv):
    """The five-step env whose 3rd step raises."""

    def step(self, actions):
        if sum(1 for _ in self.taken) == 2 * self.num_envs:
            raise KeyError("no such joint")
        return super().step(actions)


class RaisingCartPole(gym.envs.classic_control.CartPoleEnv):
    """CartPole whose 3rd step raises."""

    def step(self, action):
        self.t = getattr(self, "t", 0) + 1
        if self.t == 3:
            raise KeyError("no such joint")
        return super().step(action)


@pytest.mark.parametrize("backend", ["vector", "gymnasium"])
def test_an_env_whose_step_raises_is_named_in_one_line_with_worker_envs_and_step(backend):
    """The line a failed rollout worker's run reports (its traceback's last): the env, its exception and the line of
    its code, the worker, its envs (the vector env's, or the gymnasium env that raised) and the step; the env's own
    exception is the cause (its traceback in log.txt)."""
    from msf.envs.registry import register_env, register_vector_env
    from msf.envs.vector import EnvStepFailed

    register_vector_env("MsfRaisingVector", lambda name, n, env_config: RaisingVectorEnv(n, env_config["env_index"]))
    register_env("MsfRaisingGym", lambda name, env_config: RaisingCartPole())
    name, cls, where = {
        "vector": ("MsfRaisingVector", RaisingVectorEnv, "envs 12..13"),
        "gymnasium": ("MsfRaisingGym", RaisingCartPole, "env 12"),
    }[backend]
    split = make_split(Config(env=name, env_backend=backend, decorrelate_envs_on_one_worker=False), 3, [12, 13], seed=0)
    split.reset()
    for _ in range(2):
        split.step(np.zeros(2, dtype=np.int64))
    with pytest.raises(EnvStepFailed) as e:
        split.step(np.zeros(2, dtype=np.int64))
    line = int(cls.step.__code__.co_firstlineno) + (2 if backend == "vector" else 3)
    assert str(e.value) == (
        f"{name}'s step raised KeyError: 'no such joint' (test_vector_split.py:{line}, in step), on rollout "
        f"worker 3, {where}, at step 3"
    )
    assert isinstance(e.value.__cause__, KeyError)
    split.close()
