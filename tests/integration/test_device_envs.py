"""A device-side env (``--env_gpu_actions=True``) through msf-train on CPU device groups: two device groups with
--deterministic repeat bit for bit, their replicas equal at every checksum; a NaN observation ends the run in one
line and leaves finite weights; the torch CartPole with 1,024 envs reaches gymnasium's threshold (slow)."""

from __future__ import annotations

import glob

import numpy as np
import pytest
import torch

from .conftest import SLACK_S, read_summary, run_msf, run_msf_together, write_untrained_checkpoint

DEVICE_CARTPOLE = [
    "--env=torch_cartpole",
    "--env_gpu_actions=True",
    "--env_gpu_observations=True",
    "--encoder_mlp_layers",
    "64",
    "64",
    "--value_bootstrap=True",
    "--reward_scale=0.1",
    "--learning_rate=1e-3",
    "--num_batches_to_accumulate=0",
]


def _last_checkpoint(train_dir, name: str) -> dict:
    (last,) = sorted(glob.glob(str(train_dir / name / "checkpoint_p0" / "checkpoint_*.pth")))[-1:]
    return torch.load(last, weights_only=False)


def test_two_device_groups_deterministic_runs_repeat_bit_for_bit(train_dir):
    """2 device groups x 64 torch CartPoles, --deterministic, a replica checksum every iteration (a difference
    fails the run): two runs give the same weights, optimiser state, episodes and counts."""
    args = [
        *DEVICE_CARTPOLE,
        "--nproc_per_node=2",
        "--num_envs_per_worker=64",
        "--rollout=16",
        "--batch_size=512",
        "--num_batches_per_epoch=2",
        "--num_epochs=2",
        "--deterministic=True",
        "--seed=3",
        "--ddp_check_interval=1",
        "--train_for_env_steps=20000",
    ]
    runs = run_msf_together(
        [[*args, f"--experiment={name}", f"--train_dir={train_dir}"] for name in ("a", "b")], timeout=300 + SLACK_S
    )
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    (sa, sb), (ca, cb) = [read_summary(train_dir, n) for n in "ab"], [_last_checkpoint(train_dir, n) for n in "ab"]
    # 2 groups x 64 envs x 16 steps = 2,048 steps = one iteration (512 x 2 per group): 10 iterations, 4 SGD steps each
    assert sa["status"] == "done" and sa["world_size"] == 2 and sa["env_steps"] == 20480 == sb["env_steps"]
    assert sa["train_steps"] == sb["train_steps"] == 40 and sa["async_rl"] is False
    assert sa["env_steps_trained"] == sa["env_steps"] and sa["env_step_calls"] == sa["env_steps"]
    for k in ca["model"]:
        assert torch.equal(ca["model"][k], cb["model"][k]), k
    assert ca["episode_returns"] == cb["episode_returns"] and len(ca["episode_returns"]) > 30
    assert ca["episode_lengths"] == cb["episode_lengths"] and ca["episode_returns"] == [
        float(n) for n in ca["episode_lengths"]
    ]  # a reward of 1 per step
    assert sa["episodes"] == sb["episodes"] == ca["episodes"]


def test_a_nan_observation_ends_the_run_in_one_line_with_finite_weights(train_dir):
    r = run_msf(
        [
            *DEVICE_CARTPOLE[1:],
            "--env=device_test_envs:nan_cartpole",
            "--num_envs_per_worker=32",
            "--rollout=16",
            "--batch_size=256",
            "--num_batches_per_epoch=2",
            f"--train_dir={train_dir}",
            "--experiment=nan",
        ],
        timeout=120 + SLACK_S,
    )
    line = "device_test_envs:nan_cartpole returned a non-finite observation (nan) for env 31 at episode step "
    assert r.returncode != 0
    s = read_summary(train_dir, "nan")
    assert s["status"] == "failed" and s["error"].startswith(line), s["error"]
    assert s["error"].endswith(", on device group 0, at vector step 200") and "\n" not in s["error"]
    assert line in r.stderr and "Traceback" not in r.stderr
    # 12 rollouts of 16 steps were trained on (192 steps); the one with the NaN never reached the learner
    assert s["env_steps_trained"] == 12 * 16 * 32
    ckpt = _last_checkpoint(train_dir, "nan")
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point())


@pytest.mark.slow
def test_1024_torch_cartpoles_reach_gymnasiums_threshold(train_dir):
    """The recommended device-env command line (docs/device_envs.md): mean return >= 475 over the last 100
    episodes, within 3M frames."""
    r = run_msf(
        [
            *DEVICE_CARTPOLE,
            "--num_envs_per_worker=1024",
            "--rollout=16",
            "--batch_size=4096",
            "--num_batches_per_epoch=4",
            "--num_epochs=4",
            "--stop_at_return_mean=475",
            "--train_for_env_steps=3000000",
            "--experiment_summaries_interval=1",
            f"--train_dir={train_dir}",
            "--experiment=solve",
        ],
        timeout=600 + SLACK_S,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "solve")
    assert s["status"] == "done" and s["episode_return_mean"] >= 475 and s["env_steps"] < 3_000_000
    assert s["return_target_reached_at"] is not None


def test_enjoy_plays_and_export_writes_a_device_env_checkpoint(tmp_path, capsys):
    """msf-enjoy and msf-export on a torch_cartpole experiment (the spaces as registered, no gymnasium env): enjoy
    plays one instance on the CPU with the policy's most likely actions, the episodes a step-by-step replay of
    the same seed gives; export's logits are the model's."""
    import json

    import onnxruntime as ort

    from msf.cfg.config import Config
    from msf.enjoy import main as enjoy
    from msf.envs.device_env import device_env_entry, device_env_spaces
    from msf.envs.torch_cartpole import TorchCartPole
    from msf.export import main as export

    cfg = Config(
        env="torch_cartpole", env_gpu_actions=True, experiment="dev", train_dir=str(tmp_path), encoder_mlp_layers=[16]
    )
    model = write_untrained_checkpoint(cfg, device_env_spaces(device_env_entry(cfg.env)))

    args = ["--experiment=dev", f"--train_dir={tmp_path}"]
    assert enjoy([*args, "--max_num_episodes=3", "--no_render", "--eval_deterministic=True"]) == 0
    played = json.load(open(tmp_path / "dev" / "eval.json"))["episodes"]
    env, lengths = TorchCartPole(1, torch.device("cpu"), 0), []  # enjoy's seed: --seed's, 0 when unset
    for _ in range(3):
        obs, n, ended = env.reset(), 0, False
        while not ended:
            with torch.no_grad():
                obs, _, term, trunc = env.step(model.mode(model.forward_with_states(obs, None)[0]))
            n, ended = n + 1, bool(term[0] | trunc[0])
        lengths.append(n)
    assert [e["length"] for e in played] == lengths and [e["return"] for e in played] == [float(n) for n in lengths]

    assert export(args) == 0
    session = ort.InferenceSession(str(tmp_path / "dev" / "export" / "policy_p0.onnx"))
    obs = torch.randn(8, 4)
    (logits,) = session.run(["action_logits"], {"obs": obs.numpy()})
    with torch.no_grad():
        assert np.abs(logits - model.forward_with_states(obs, None)[0].numpy()).max() < 1e-5
    assert "Traceback" not in capsys.readouterr().err
