"""Flag sets the documentation recommends (docs/training.md), kept here once: tests and benchmarks use the same."""

# Small, fast environments such as CartPole-v1 (docs/training.md, "Settings for small environments"):
# more envs per worker to amortise the per-request cost, a smaller batch for more updates per
# sample, two epochs over two minibatches of each 1,024-sample iteration (4 SGD steps: from the
# second on, PPO's clip and the KL-adaptive schedule see how far the policy moved), a KL-adaptive lr
# that starts at 3e-4 and may grow to 2e-3, and value bootstrapping on time-outs (CartPole
# truncates at 500 steps; treating that as a failure destabilises the critic).
# No accumulated trajectories (--num_batches_to_accumulate=0; Sample Factory holds 2 iterations): where the learner
# is the slower stage, a spare iteration only ages the experience (benchmarks/HISTORY.md has the measurements).
SMALL_ENV_FLAGS = [
    "--num_workers=2",
    "--num_envs_per_worker=16",
    "--worker_num_splits=2",
    "--batch_size=512",
    "--num_batches_per_epoch=2",
    "--num_epochs=2",
    "--rollout=32",
    "--learning_rate=3e-4",
    "--lr_schedule=kl_adaptive_epoch",
    "--lr_adaptive_max=2e-3",
    "--value_bootstrap=True",
    "--reward_scale=0.1",
    "--num_batches_to_accumulate=0",
]

# Sample Factory's Atari arguments for 2 cores as msf flags (its atari_override_defaults, on 2 workers x 4 envs for its
# 8 x 1): what benchmarks/families.py runs beside Sample Factory 2, and the base of the preset below (a test checks them
# against Sample Factory 2.1.1's own table, tests/unit/test_presets.py).
SF_ATARI_FLAGS = [
    "--num_workers=2",
    "--num_envs_per_worker=4",
    "--encoder_conv_architecture=convnet_atari",
    "--nonlinearity=relu",
    "--exploration_loss_coeff=0.01",
    "--batch_size=256",
    "--rollout=128",
    "--max_grad_norm=0.5",
    "--num_epochs=4",
    "--num_batches_per_epoch=4",
    "--learning_rate=0.00025",
    "--lr_schedule=linear_decay",
    "--adam_eps=1e-5",
]

# Atari on a small machine (a few CPU cores; docs/training.md, "Settings for Atari ..."): SF_ATARI_FLAGS with
# two epochs instead of four (the learner is the slow stage, and four epochs are most of its work: more frames to a
# score, less wall time), asynchronous collection instead of the family's --async_rl=False, a constant lr (the run
# ends at a score, --stop_at_return_mean, not at a budget that a linear decay would need to know), a near-uniform
# action head (gain 0.01; msf's default, Sample Factory's rule, is what doom_basic needs; Pong learns sooner so), and
# 52x52 pixels instead of 84x84 (a quarter of the conv stack's work; Pong still learns): benchmarks/HISTORY.md has
# the measurements.
_SMALL_MACHINE = {"--num_epochs": "2", "--lr_schedule": "constant"}
ATARI_SMALL_MACHINE_FLAGS = [
    *(f"{k}={_SMALL_MACHINE.get(k, v)}" for k, v in (f.split("=", 1) for f in SF_ATARI_FLAGS)),
    "--async_rl=True",
    "--action_head_init_gain=0.01",
    "--atari_screen_size=52",
]
