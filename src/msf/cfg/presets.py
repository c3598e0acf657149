"""Flag sets the README recommends, kept here once so that tests and benchmarks use the same."""

# Small, fast environments such as CartPole-v1 (README, "Settings for small environments"):
# more envs per worker to amortise the per-request cost, a smaller batch for more updates per
# sample, two epochs over two minibatches of each 1,024-sample iteration (4 SGD steps: from the
# second on, PPO's clip and the KL-adaptive schedule see how far the policy moved), a KL-adaptive lr
# that starts at 3e-4 and may grow to 2e-3, and value bootstrapping on time-outs (CartPole
# truncates at 500 steps; treating that as a failure destabilises the critic).
# With one SGD step per 512 samples instead, the KL the schedule sees is the policy lag's only, the lr
# sat at its 2e-3 cap, and runs on a loaded machine failed to hold 475 (benchmarks/README.md, 2026-12-02).
# No accumulated trajectories (Sample Factory holds 2 iterations; msf's 0 gives the workers no spare slots): an env
# whose trajectory is finished waits until the learner has copied it out. When the learner is the slower stage (2
# device groups on 2 cores) a spare iteration only aged the experience by one iteration: with 1, the mean policy lag
# was 7.7 SGD steps with 2 groups and 4.4 with one, and 2 groups x 256 needed 1.06x the env steps of 1 group x 512
# to a mean return of 475; with 0, 3.7 and 2.8, and 0.97x; 2 groups need 11% fewer steps than with 1 and arrive 8%
# sooner, one group 2% fewer at ~4% fewer steps/s (30 seeds each, benchmarks/README.md, 2026-12-05).
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

# Atari on a small machine (a few CPU cores; README, "Settings for Atari on a small machine"): Sample Factory's Atari
# arguments (8 envs, rollout 128, 4 minibatches of 256, lr 2.5e-4, entropy 0.01, grad norm 0.5; clip 0.1 and the rest
# from the family defaults) with two epochs instead of four, asynchronous collection instead of the family's
# --async_rl=False, and a constant lr (the run ends at a score, --stop_at_return_mean, not at a budget that a linear
# decay would need to know). On 2 cores the learner is the slow stage, and four epochs are most of its work:
# atari_pong trained at 894 frames/s with Sample Factory's arguments, 908 with them asynchronous, 1,811 with this
# preset, the same day (benchmarks/README.md, 2026-12-03). It needs more frames to +15 (2.48M and 2.53M, seeds 0
# and 1, against ~1.9M with four epochs) and less wall time (1,421 and 1,480 s from the command's start).
# The action head starts near-uniform (gain 0.01, msf's old default; Sample Factory's rule, now msf's default, gives
# it --policy_init_gain): on Pong that reached +15 in 2.21M and 2.29M frames against 3.03M and 2.51M, seeds 0 and 1
# of the same day (benchmarks/README.md, 2026-12-04), where doom_basic needs Sample Factory's rule.
# Observations of 52x52 pixels instead of 84x84 (msf's --atari_screen_size; Sample Factory fixes 84): the conv stack's
# work per sample falls ~4x (Learner.train 412 against 1,569 core-us per env step), training runs at ~6,000-6,500
# frames/s against ~2,250, and Pong still learns: +15 in 3.10M, 3.56M and 3.64M frames, 477, 561 and 614 s from the
# command's start (seeds 0-2), against 2.29M frames and 1,021 s at 84x84 (seed 0, the same day; benchmarks/README.md,
# 2026-12-05).
_SMALL_MACHINE = {"--num_epochs": "2", "--lr_schedule": "constant"}
ATARI_SMALL_MACHINE_FLAGS = [
    *(f"{k}={_SMALL_MACHINE.get(k, v)}" for k, v in (f.split("=", 1) for f in SF_ATARI_FLAGS)),
    "--async_rl=True",
    "--action_head_init_gain=0.01",
    "--atari_screen_size=52",
]
