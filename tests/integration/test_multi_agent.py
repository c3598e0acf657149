"""Multi-agent environments: msf's interface (``num_agents``, lists per agent) and PettingZoo parallel envs.

One policy plays every agent (self-play with shared parameters); each agent of each env writes its own
trajectories. The test env is ``CoinRace`` (tests/helpers/msf_test_envs.py): two players chase a coin on a
line; a random player collects about 1.3 coins per 40-step episode, one that walks to the coin about 12.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from msf.cfg.config import Config
from msf.envs.registry import env_spaces

from .conftest import msf_env, read_summary, run_msf

ENV = "msf_test_envs:MsfCoinRace-v0"
FLAGS = [
    "--num_workers=2",
    "--num_envs_per_worker=8",
    "--worker_num_splits=2",
    "--batch_size=512",
    "--rollout=32",
    "--learning_rate=1e-3",
    "--encoder_mlp_layers",
    "64",
    "64",
    "--exploration_loss_coeff=0.01",
]


def test_spaces_are_one_agents_and_count_the_agents():
    import msf_test_envs  # noqa: F401 - registers the env

    s = env_spaces(ENV)
    assert (s.num_agents, s.obs_shape, s.discrete, s.num_actions) == (2, (27,), True, 3)
    assert env_spaces("CartPole-v1").num_agents == 1


def test_gym_split_gives_each_agent_a_row_and_resets_when_all_are_done():
    from msf.envs.vector import GymSplit

    split = GymSplit(Config(env=ENV, decorrelate_envs_on_one_worker=False), 0, [0, 1, 2], seed=0)
    obs = split.reset()
    assert len(obs) == 6
    for i in range(3):  # env i's agents are rows 2i, 2i+1: each sees itself first and the other second
        a, b = obs[2 * i], obs[2 * i + 1]
        assert np.array_equal(a[:9], b[9:18]) and np.array_equal(a[9:18], b[:9]) and np.array_equal(a[18:], b[18:])
    rng = np.random.default_rng(0)
    for t in range(1, 41):
        obs, rew, term, trunc = split.step(rng.integers(0, 3, size=6))
        assert rew.shape == term.shape == trunc.shape == (6,) and len(obs) == 6
        assert not term.any() and trunc.all() == (t == 40) and not (t < 40 and trunc.any())
    assert split.envs[0].unwrapped.game.t == 0  # reset after the 40th step, for both agents at once
    split.close()


def _play(model, episodes: int, trained: bool) -> float:
    """Mean coins of player 0 over ``episodes`` (seeded): the policy's most likely action (``trained``) or a
    random one, against a random player 1."""
    import msf_test_envs

    game = msf_test_envs.CoinRaceGame()
    rng = np.random.default_rng(1)
    total = 0.0
    for ep in range(episodes):
        obs, over = game.reset(seed=1000 + ep), False
        while not over:
            if trained:
                with torch.no_grad():
                    logits, _ = model(torch.as_tensor(obs[0])[None])
                a0 = int(logits.argmax())
            else:
                a0 = int(rng.integers(3))
            obs, rewards, over = game.step([a0, int(rng.integers(3))])
            total += rewards[0]
    return total / episodes


@pytest.mark.slow  # default-suite time (30 min on 2 cores); the slow suite runs it
def test_self_play_learns_to_beat_a_random_player(train_dir):
    from msf.model.actor_critic import ActorCritic
    from msf.persistence.checkpoint import load_latest_checkpoint

    r = run_msf(
        [
            f"--env={ENV}",
            "--experiment=coins",
            f"--train_dir={train_dir}",
            "--seed=0",
            "--train_for_env_steps=150000",
            *FLAGS,
        ],
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "coins")
    assert s["status"] == "done" and 150_000 <= s["env_steps"] < 150_000 + 512  # agent steps
    cfg = Config.from_dict(json.loads((train_dir / "coins" / "config.json").read_text()))
    model = ActorCritic(cfg, env_spaces(ENV))
    model.load_state_dict(load_latest_checkpoint(str(train_dir / "coins"))["model"])
    model.eval()
    trained, random = _play(model, 100, True), _play(model, 100, False)
    assert random < 2.0, random
    assert trained >= 6.0, (trained, random)  # a walker to the coin collects ~12


def test_pettingzoo_parallel_env_trains_and_plays(train_dir):
    pytest.importorskip("pettingzoo", reason="pettingzoo (extra [pettingzoo]) is not installed here")
    env = "msf_test_envs:msf_coin_race_pz"
    r = run_msf(
        [f"--env={env}", "--experiment=pz", f"--train_dir={train_dir}", "--train_for_env_steps=20000", *FLAGS],
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "pz")
    # 20,000 agent steps of 40-step episodes: about 500 agent-episodes, less those still running and the last
    # stats not yet drained; one agent's alone would be about 250
    assert s["status"] == "done" and s["episodes"] >= 300, s
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "msf.enjoy",
            f"--env={env}",
            "--experiment=pz",
            f"--train_dir={train_dir}",
            "--max_num_episodes=3",
            "--no_render=True",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=msf_env(),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    ev = json.loads((train_dir / "pz" / "eval.json").read_text())
    assert ev["num_episodes"] == 3 and all(len(e["agent_returns"]) == 2 and e["length"] == 40 for e in ev["episodes"])
    assert all(e["return"] == pytest.approx(np.mean(e["agent_returns"])) for e in ev["episodes"])


def test_pettingzoo_wrapper_refuses_what_msf_cannot_train():
    pytest.importorskip("pettingzoo", reason="pettingzoo (extra [pettingzoo]) is not installed here")
    import gymnasium as gym
    import msf_test_envs

    from msf.envs.pettingzoo import PettingZooParallel

    pz = msf_test_envs.coin_race_parallel_env()
    pz.action_space = lambda agent: gym.spaces.Discrete(3 if agent == "player_0" else 4)
    with pytest.raises(ValueError, match="agent 'player_1' has other spaces than 'player_0'"):
        PettingZooParallel(pz)
    pz = msf_test_envs.coin_race_parallel_env()
    env = PettingZooParallel(pz)
    env.reset(seed=0)
    real_step = pz.step

    def one_leaves(actions):
        obs, rew, term, trunc, info = real_step(actions)
        return (
            {"player_0": obs["player_0"]},
            {"player_0": rew["player_0"]},
            {"player_0": False},
            {"player_0": False},
            {},
        )

    pz.step = one_leaves
    with pytest.raises(ValueError, match=r"agent\(s\) \['player_1'\] left the episode before the others"):
        env.step([1, 1])


def test_an_agent_reported_done_twice_while_others_play_is_a_clear_error():
    """The interface: after its end an agent starts anew at once, or all end together. An env that keeps
    reporting a finished agent as terminated would otherwise count a one-step episode per step."""
    import gymnasium as gym

    from msf.envs.registry import register_env
    from msf.envs.vector import GymSplit

    class StuckAgent(gym.Env):
        num_agents = 2
        observation_space = gym.spaces.Box(0.0, 1.0, (1,), dtype=np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            self.t = 0
            return [np.zeros(1, np.float32)] * 2, {}

        def step(self, actions):
            self.t += 1
            return [np.zeros(1, np.float32)] * 2, [0.0, 0.0], [self.t >= 3, self.t >= 10], [False, False], {}

    register_env("msf_stuck_agent", lambda name, env_config: StuckAgent())
    split = GymSplit(Config(env="msf_stuck_agent"), 0, [0], seed=0)
    split.reset()
    for _ in range(3):
        split.step(np.zeros(2, dtype=np.int64))  # agent 0 ends at step 3: fine
    with pytest.raises(ValueError, match="msf_stuck_agent: agent 0 reported its episode's end on two steps in a row"):
        split.step(np.zeros(2, dtype=np.int64))


def test_the_summary_counts_the_envs_step_calls_beside_the_agents_steps(train_dir):
    """A 2-agent env: ``env_steps`` counts agent steps (2 per ``env.step`` call), ``env_step_calls`` the calls
    (those the rollout workers made up to the last agreement): twice the calls is at least the agent steps taken,
    and more by at most what the trajectory buffer holds at each run's end. A resumed run counts on from its
    checkpoint's calls."""
    from msf.cfg.arguments import parse_args
    from msf.cfg.config import Derived

    args = [f"--env={ENV}", "--experiment=calls", f"--train_dir={train_dir}", *FLAGS]
    cfg = parse_args(args)[0]
    derived = Derived.of(cfg, 2)
    in_buffer = cfg.num_workers * derived.slots_per_worker * cfg.rollout  # agent steps sampled, not yet taken
    calls = []
    for runs, budget in enumerate((4096, 8192), 1):
        r = run_msf([*args, f"--train_for_env_steps={budget}"], timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        s = read_summary(train_dir, "calls")
        assert s["status"] == "done" and s["env_steps"] >= budget, s
        assert 0 <= 2 * s["env_step_calls"] - s["env_steps"] <= runs * in_buffer, s
        calls.append(s["env_step_calls"])
    assert calls[1] >= calls[0] + 4096 // 2  # counted on from the checkpoint
