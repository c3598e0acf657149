"""Unity ML-Agents scenes through ``msf.envs.unity.UnityMultiAgent``, against a fake of the low-level API
(tests/helpers/fake_unity.py: two teams of two agents, two observations per agent, one agent whose
episodes end early and restart at once, as Unity does)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("mlagents_envs", reason="mlagents-envs (extra [unity]) is not installed here")

from .conftest import read_summary, run_msf  # noqa: E402


def test_the_wrapper_maps_teams_agents_and_their_own_episode_ends():
    from fake_unity import FakeDuel

    from msf.envs.unity import UnityMultiAgent

    fake = FakeDuel(seed=0)
    env = UnityMultiAgent(fake)
    assert env.num_agents == 4 and env.agent_teams == [0, 0, 1, 1]
    assert set(env.observation_space.spaces) == {"obs_0", "obs_1"} and env.action_space.n == 3
    obs, _ = env.reset()
    assert fake.resets == 1  # the scene was reset once, at construction
    for t in range(1, 21):
        cues = [int(o["obs_0"].argmax()) for o in obs]
        obs, rew, term, trunc, _ = env.step(cues)  # always right: reward 1 each
        assert rew.tolist() == [1.0] * 4
        if t == 10:
            assert term == [False, False, False, True] and not any(trunc)
            assert obs[3]["obs_1"][1] == 0.0  # agent 3's next episode's first observation
        elif t == 20:
            assert trunc == [True] * 4 and not any(term)
        else:
            assert not any(term) and not any(trunc)
    env.reset()
    assert fake.resets == 2
    env.close()
    assert fake.closed


@pytest.mark.slow  # default-suite time (30 min on 2 cores); the slow suite runs it
def test_two_teams_train_end_to_end_with_dict_observations(train_dir):
    r = run_msf(
        [
            "--env=msf_test_envs:unity_fake_duel",
            "--experiment=unity",
            f"--train_dir={train_dir}",
            "--seed=0",
            "--num_policies=2",
            "--num_workers=2",
            "--num_envs_per_worker=2",
            "--batch_size=256",
            "--rollout=16",
            "--learning_rate=3e-3",
            "--encoder_mlp_layers",
            "32",
            "--train_for_env_steps=60000",
        ],
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "unity")
    assert s["status"] == "done"
    # random actions earn 1/3 per step: about 5.3 per episode over these agents; naming the cue, 16
    returns = [ps["episode_return_mean"] for ps in s["policies"].values()]
    assert min(returns) >= 12.0, s["policies"]
    # the two observations reached the model as two inputs with their own encoders
    state = torch.load(sorted((train_dir / "unity" / "checkpoint_p0").glob("checkpoint_*.pth"))[-1], weights_only=True)
    keys = list(state["model"])
    assert any(".encoders.obs_0." in k for k in keys) and any(".encoders.obs_1." in k for k in keys), keys[:20]


def test_a_unity_scene_needs_its_path(tmp_path):
    r = run_msf(["--env=unity_soccer", "--experiment=u", f"--train_dir={tmp_path}"], timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "msf-train: error: --unity_env_path: unity_soccer needs the path of a built Unity scene (an executable)"
    )
    r = run_msf(
        [
            "--env=unity_soccer",
            f"--unity_env_path={tmp_path / 'nope.x86_64'}",
            "--experiment=u",
            f"--train_dir={tmp_path}",
        ],
        timeout=60,
    )
    assert r.returncode == 2 and "--unity_env_path: no file" in r.stderr
    assert not (tmp_path / "u").exists()
