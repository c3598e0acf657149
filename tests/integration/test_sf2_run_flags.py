"""Sample Factory 2's run flags on msf, in real runs: --log_to_file, --use_env_info_cache,
--force_envs_single_thread, --decorrelate_experience_max_seconds, --flush_summaries_interval, and the warning
for a flag that has no effect."""

from __future__ import annotations

import json

from .conftest import msf_env, read_summary, run_msf


def test_run_flags_of_sample_factory(train_dir, tmp_path):
    record = tmp_path / "constructions.txt"
    env = {**msf_env(), "MSF_TEST_SLOW_START_S": "0", "MSF_TEST_CONSTRUCTIONS": str(record)}
    args = [
        "--env=msf_test_envs:MsfSlowStartCartPole-v0",
        "--experiment=sf",
        f"--train_dir={train_dir}",
        "--num_workers=2",
        "--num_envs_per_worker=4",
        "--batch_size=256",
        "--log_to_file=False",
        "--use_env_info_cache=True",
        "--force_envs_single_thread",
        "--decorrelate_experience_max_seconds=3",
        "--flush_summaries_interval=1",
        "--pixel_format=HWC",
    ]
    r = run_msf([*args, "--train_for_env_steps=4000"], timeout=240, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    exp = train_dir / "sf"
    assert read_summary(train_dir, "sf")["status"] == "done"
    assert not (exp / "log.txt").exists()  # --log_to_file=False: the console only
    assert "frames " in r.stderr  # the status lines went there
    info = json.loads((exp / "env_info.json").read_text())
    assert info["env"] == "msf_test_envs:MsfSlowStartCartPole-v0" and info["spaces"]["obs_shape"] == [4]
    # worker 1 of 2 waited 1/2 x 3 s before its first step (Sample Factory's decorrelation of the workers)
    assert "rollout worker 1 waits 1.5 s before its first step" in r.stderr
    assert "rollout worker 0 waits" not in r.stderr
    # one warning, with the reason, for the flag that changes nothing here
    warned = [line for line in r.stderr.splitlines() if "--pixel_format is accepted from Sample Factory" in line]
    assert len(warned) == 1 and "channel axis" in warned[0]
    made = record.read_text().split()
    assert made.count("MainProcess") == 1 and len(made) == 1 + 8  # the launcher read the spaces once, 8 envs
    record.write_text("")
    # the second start reads the spaces from env_info.json: no env in the launcher
    r = run_msf([*args, "--train_for_env_steps=8000"], timeout=240, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    made = record.read_text().split()
    assert "MainProcess" not in made and len(made) == 8
    assert read_summary(train_dir, "sf")["env_frames"] >= 8000
