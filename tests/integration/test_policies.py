"""Several policies (``--num_policies``) on several device groups, PBT, and self-play with mixed policies.

Replicas of a policy are compared every iteration by ``--ddp_check_interval=1`` (checksums of weights,
normalisers and optimiser state, gathered over the ranks: a difference fails the run)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from msf.cfg.config import Config
from msf.envs.registry import env_spaces

from .conftest import msf_env, read_summary, run_msf
from .test_multi_agent import ENV as COIN_RACE
from .test_multi_agent import FLAGS as COIN_FLAGS
from .test_multi_agent import _play

SMALL = [
    "--env=CartPole-v1",
    "--num_workers=2",
    "--num_envs_per_worker=8",
    "--batch_size=512",
    "--learning_rate=1e-3",
    "--ddp_check_interval=1",
    "--experiment_summaries_interval=2",
]


def _latest(exp, p: int) -> dict:
    return torch.load(sorted((exp / f"checkpoint_p{p}").glob("checkpoint_*.pth"))[-1], weights_only=True)


@pytest.mark.slow  # default-suite time (30 min on 2 cores); the slow suite runs it
def test_two_policies_on_two_device_groups_with_a_pbt_exchange(train_dir):
    args = [
        *SMALL,
        "--experiment=pbt",
        f"--train_dir={train_dir}",
        "--seed=1",
        "--num_policies=2",
        "--nproc_per_node=2",
        "--with_pbt=True",
        "--pbt_period_env_steps=20000",
        "--pbt_start_mutation=0",
        "--pbt_replace_reward_gap=0",
        "--pbt_mutation_rate=1.0",
    ]
    # in two runs: the second resumes, and the PBT history goes on
    r = run_msf([*args, "--train_for_env_steps=30000"], timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    first = read_summary(train_dir, "pbt")["pbt_replacements"]
    assert [rec["round"] for rec in first] == [1] and first[0]["frames"] < 30000
    r = run_msf([*args, "--train_for_env_steps=50000"], timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    exp = train_dir / "pbt"
    s = read_summary(train_dir, "pbt")
    assert s["status"] == "done" and s["world_size"] == 2 and s["num_policies"] == 2
    assert set(s["policies"]) == {"0", "1"}
    for ps in s["policies"].values():
        assert ps["train_steps"] > 10 and ps["episode_return_mean"] is not None
    # four learners: each policy's two replicas matched at every iteration (else the run would have failed)
    log = (exp / "log.txt").read_text()
    assert "ReplicaMismatch" not in log and "replicas differ" not in log
    # the PBT exchanges, as summary.json records them: the donor's weights, perturbed hyperparameters. That
    # rank 1 applied the same decision is checked by --ddp_check_interval=1: the replicas are compared right
    # after the round and at every iteration after it, and other weights or another lr would fail the run.
    defaults = Config(learning_rate=1e-3)
    for rec in s["pbt_replacements"]:
        assert rec["weights_checksum"] == rec["donor_weights_checksum"], rec
        lr = rec["hyperparameters"]["learning_rate"]
        assert lr != defaults.learning_rate and 1e-3 / 1.5**3 <= lr <= 1e-3 * 1.5**3  # perturbed (rate 1)
    assert len(s["pbt_replacements"]) == 2  # periods at 20k and 40k frames
    assert s["pbt_replacements"][0] == first[0] and [rec["round"] for rec in s["pbt_replacements"]] == [1, 2]
    rec = s["pbt_replacements"][-1]
    assert s["policies"][str(rec["recipient"])]["hyperparameters"] == rec["hyperparameters"]
    # and the two policies are different networks
    p0, p1 = _latest(exp, 0), _latest(exp, 1)
    assert p0["policy"] == 0 and p1["policy"] == 1
    assert any(not torch.equal(p0["model"][k], p1["model"][k]) for k in p0["model"])
    # msf-enjoy plays either policy, and names a policy that does not exist
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "msf.enjoy",
            "--experiment=pbt",
            f"--train_dir={train_dir}",
            "--policy_index=1",
            "--max_num_episodes=2",
            "--no_render=True",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=msf_env(),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    ev = json.loads((exp / "eval.json").read_text())
    assert (
        ev["policy_index"] == 1 and ev["policy_version"] == p1["policy_version"] and "checkpoint_p1" in ev["checkpoint"]
    )
    r = subprocess.run(
        [sys.executable, "-m", "msf.enjoy", "--experiment=pbt", f"--train_dir={train_dir}", "--policy_index=2"],
        capture_output=True,
        text=True,
        timeout=120,
        env=msf_env(),
    )
    assert r.returncode == 2 and "--policy_index: must be in [0, 2)" in r.stderr


@pytest.mark.slow  # default-suite time (CI's slow suite runs it)
def test_a_replica_without_experience_for_a_policy_neither_hangs_nor_desynchronises(train_dir):
    """One env per rank, one policy per env (no mixing): in many iterations a rank holds a batch for one
    policy only, and joins the other policy's step with an all-masked batch."""
    r = run_msf(
        [
            "--env=CartPole-v1",
            "--experiment=sparse",
            f"--train_dir={train_dir}",
            "--seed=2",
            "--num_policies=2",
            "--nproc_per_node=2",
            "--num_workers=2",
            "--num_envs_per_worker=1",
            "--worker_num_splits=1",
            "--pbt_mix_policies_in_one_env=False",
            "--rollout=16",
            "--batch_size=64",
            "--ddp_check_interval=1",
            "--train_for_env_steps=12000",
        ],
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(train_dir, "sparse")
    assert s["status"] == "done" and 12_000 <= s["env_steps"] < 12_000 + 2 * 64 * 2
    empty = {p: ps["empty_batches"] for p, ps in s["policies"].items()}
    assert sum(empty.values()) > 0, empty  # the case happened
    for ps in s["policies"].values():
        assert ps["train_steps"] > 0


@pytest.mark.slow  # default-suite time (30 min on 2 cores); the slow suite runs it
def test_self_play_with_two_mixed_policies_learns(train_dir):
    r = run_msf(
        [
            f"--env={COIN_RACE}",
            "--experiment=mixed",
            f"--train_dir={train_dir}",
            "--seed=0",
            "--num_policies=2",
            "--pbt_mix_policies_in_one_env=True",
            "--train_for_env_steps=300000",
            *COIN_FLAGS,
        ],
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    from msf.model.actor_critic import ActorCritic
    from msf.persistence.checkpoint import load_latest_checkpoint

    cfg = Config.from_dict(json.loads((train_dir / "mixed" / "config.json").read_text()))
    scores = []
    for p in (0, 1):
        model = ActorCritic(cfg, env_spaces(COIN_RACE))
        model.load_state_dict(load_latest_checkpoint(str(train_dir / "mixed"), policy=p)["model"])
        model.eval()
        scores.append(_play(model, 100, True))
    random = _play(model, 100, False)
    assert random < 2.0 and min(scores) >= 5.0, (scores, random)
    s = read_summary(train_dir, "mixed")
    assert all(ps["train_steps"] > 20 for ps in s["policies"].values())
