"""Flag sets the README recommends, kept here once so that tests and benchmarks use the same."""

# Small, fast environments such as CartPole-v1 (README, "Settings for small environments"):
# more envs per worker to amortise the per-request cost, a smaller batch for more updates per
# sample, a KL-adaptive lr that starts at 3e-4 and may grow to 2e-3, and value bootstrapping on
# time-outs (CartPole truncates at 500 steps; treating that as a failure destabilises the critic).
SMALL_ENV_FLAGS = [
    "--num_workers=2",
    "--num_envs_per_worker=16",
    "--worker_num_splits=2",
    "--batch_size=512",
    "--rollout=32",
    "--learning_rate=3e-4",
    "--lr_schedule=kl_adaptive_epoch",
    "--lr_adaptive_max=2e-3",
    "--value_bootstrap=True",
    "--reward_scale=0.1",
]
