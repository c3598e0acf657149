"""Every flag of ``msf-train``: one dataclass per ``--help`` group, in the order of the data flow.

:class:`msf.cfg.config.Config` inherits all of them, so a flag is read flat (``cfg.batch_size``). Each
field carries in its ``metadata`` its help text, its ``--help`` group, its choices, the item type of a
list flag, and its scopes: the sets of flags that are treated alike outside parsing and validation
(:data:`LAUNCH`, :data:`FIXED`, :data:`PER_NODE`; :mod:`msf.cfg.config` derives the name sets from them).
Names, meanings and defaults follow Sample Factory 2.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

from typing_extensions import dataclass_transform

# Scopes of a flag (a field may have several):
LAUNCH = "launch"
"""Where and how this launch runs, not what the experiment is: on resume it comes from the current
command line (like torchrun's own arguments), so that an experiment resumes on another number of
device groups."""
FIXED = "fixed"
"""The checkpoint's shapes depend on it: changing it for an existing experiment is an error."""
PER_NODE = "per_node"
"""It may differ between the nodes of one job (the seed is then rank 0's for all)."""

BASIC = "basic"
SAMPLING = "sampling (rollout and inference workers)"
LEARNING = "learning (PPO, advantages, optimiser)"
MODEL = "model"
STOPPING = "stopping"
PERSISTENCE = "checkpoints and summaries"
DISTRIBUTED = "distributed (data-parallel learners)"
POLICIES = "several policies and population-based training"
COMPAT = "accepted from Sample Factory 2, no effect in msf"
EVALUATION = "evaluation (msf-enjoy)"


@dataclass(frozen=True)
class _Flag:
    default: Any
    help: str
    choices: tuple | None
    item_type: type
    scope: frozenset[str]


def flag(
    default: Any, help: str, choices: tuple | None = None, item_type: type = int, scope: tuple[str, ...] = ()
) -> Any:
    """A flag of a :func:`section`: its default, ``--help`` text, choices (None: any value), the item type
    of a list flag and its scopes."""
    return _Flag(default, help, choices, item_type, frozenset(scope))


@dataclass_transform()
def section(group: str) -> Callable[[type], type]:
    """Class decorator: the class becomes a dataclass whose :func:`flag` attributes are fields of the
    ``--help`` group ``group``, each with its help, group, choices, item type and scopes in ``metadata``."""

    def make(cls: type) -> type:
        for name, spec in list(vars(cls).items()):
            if isinstance(spec, _Flag):
                meta: dict[str, Any] = dict(help=spec.help, group=group, choices=spec.choices, item_type=spec.item_type)
                meta["scope"] = spec.scope
                if isinstance(spec.default, list):  # a fresh list per instance
                    f = field(default_factory=spec.default.copy, metadata=meta)
                else:
                    f = field(default=spec.default, metadata=meta)
                setattr(cls, name, f)
        return dataclass(cls)

    return make


@section(BASIC)
class BasicFlags:
    algo: str = flag(
        "APPO",
        "Algorithm (Sample Factory's flag): APPO, asynchronous PPO, the one algorithm of Sample Factory 2 and msf",
        ("APPO",),
    )
    env: str = flag(
        "CartPole-v1",
        "Environment: a gymnasium id (also 'module:Id'), or a name given to register_env",
        scope=(FIXED,),
    )
    experiment: str = flag("default_experiment", "Experiment name; results go to train_dir/experiment", scope=(LAUNCH,))
    train_dir: str = flag("./train_dir", "Root folder of all experiments", scope=(LAUNCH, PER_NODE))
    restart_behavior: str = flag(
        "resume",
        "resume: continue from the latest checkpoint of the experiment; restart: move the old experiment "
        "folder aside and start anew; overwrite: delete it and start anew",
        ("resume", "restart", "overwrite"),
        scope=(LAUNCH,),
    )
    device: str = flag(
        "gpu",
        "Device of the learner and inference workers: gpu (falls back to cpu when CUDA is not available) or cpu",
        ("gpu", "cpu"),
        scope=(LAUNCH,),
    )
    seed: int | None = flag(
        None,
        "Seed of the model initialisation and of the environments (default: a random one)",
        scope=(PER_NODE,),
    )


@section(SAMPLING)
class SamplingFlags:
    num_workers: int = flag(
        os.cpu_count() or 1,
        "Rollout worker processes on this machine; the default is the number of CPU cores",
        scope=(PER_NODE,),
    )
    num_envs_per_worker: int = flag(2, "Environments stepped by each rollout worker")
    worker_num_splits: int = flag(
        2,
        "Groups the envs of a worker are split into for double-buffered sampling: while one group waits "
        "for actions the other steps. Must divide num_envs_per_worker",
    )
    policy_workers_per_policy: int = flag(
        1, "Inference worker processes per policy; rollout workers are assigned to them round-robin"
    )
    rollout: int = flag(32, "Length of the trajectories written to the trajectory buffer, in env steps")
    recurrence: int = flag(
        -1,
        "Length of the sequences the learner re-runs the recurrent core over (backpropagation through time); "
        "-1: rollout with --use_rnn, else 1. Must divide rollout",
    )
    num_batches_to_accumulate: int = flag(
        2,
        "How many training iterations of finished trajectories the rollout workers may hold beyond the one "
        "the learner is taking (their spare buffer slots). When sampling outruns the learner, the policy lag "
        "grows with it: 1 keeps the experience fresher, 2 keeps the learner fed. 0 (msf only): no spare slots; an "
        "env whose trajectory is finished waits until the learner has copied it out, the least lag (with "
        "--serial_mode, 1)",
    )
    async_rl: bool = flag(
        True,
        "Collect experience while the learner trains on the previous batch (Sample Factory's flag and default). "
        "False: synchronous PPO: every env collects its share of one training iteration with the current "
        "weights, then waits while the learner trains on exactly those trajectories, so that every sample's "
        "policy lag at its first SGD step is 0 (summary.json: policy_lag_max_run). Needs one policy, and a "
        "training iteration (batch_size x num_batches_per_epoch) that is a whole multiple of what one rollout of "
        "every env of a device group gives (its envs x agents x rollout)",
    )
    serial_mode: bool = flag(
        False,
        "Run each device group in one process (Sample Factory's flag): its envs, its inference and its learner, "
        "the same components stepped one after the other instead of in worker processes. For debugging (pdb, "
        "py-spy, a breakpoint in an env) and in-process tests; slower. Combines with --nproc_per_node=N (every "
        "device group serial), --async_rl and every env family, policy count and model",
        scope=(LAUNCH,),
    )
    deterministic: bool = flag(
        False,
        "The same command with the same --seed on the same machine gives the same run, bit for bit: the same "
        "model and optimiser tensors in every checkpoint. Implies --async_rl=False and --learner_threads=1 "
        "(unless given); envs are seeded by the seed and their job-wide index, actions are drawn from a "
        "generator per env seeded alike, an inference batch is one split of one rollout worker, a training "
        "batch is in job-wide env order, torch.use_deterministic_algorithms is on. Slower (benchmarks/). An env "
        "that is not deterministic itself is the user's",
    )
    max_policy_lag: int = flag(
        1000,
        "Trajectories whose oldest action is more than this many policy versions old are dropped (and counted)",
    )
    learner_threads: int = flag(
        0,
        "torch threads of each learner replica. 0: start with the cores left when every rollout and inference "
        "worker of the node holds one (at least 1), then, at the first summary 30 s in, set them once from the "
        "measured load: the replica's share of the cores minus what its workers kept busy (kept when the "
        "learner waits > 10%%); with --async_rl=False, the replica's share of the cores (the workers wait while it "
        "trains)",
    )
    set_workers_cpu_affinity: bool = flag(
        True,
        "Pin each rollout worker to one CPU core: worker i of the node (counted over its device groups) goes to "
        "the (i mod n)-th of the n cores this process may use (os.sched_getaffinity: all cores, or those of "
        "taskset or a Slurm allocation), when the workers spread evenly: at most one per core, or a multiple of n",
    )
    default_niceness: int = flag(
        0,
        "Niceness of the learner (Sample Factory's flag); inference workers run 2 and rollout workers 10 above "
        "it when there is more than one rollout worker, so that on a busy machine the learner keeps its core. "
        "0 leaves the learner as started; below the current niceness needs privileges",
    )
    env_frameskip: int = flag(
        1,
        "Frames covered by one env step, for counting env frames (default: 1 for gymnasium envs, 4 for atari_* and "
        "doom_*)",
    )
    env_backend: str = flag(
        "gymnasium",
        "How rollout workers step their envs: gymnasium (one env object each, a Python loop), vector (one "
        "gymnasium VectorEnv per split of a worker, one call: a gymnasium id's vector entry point such as "
        "CartPole-v1's, ale-py's AtariVectorEnv for atari_*, or msf.envs.register_vector_env; docs/vector_envs.md) "
        "or envpool (one EnvPool per split; atari_*, mujoco_* and the classic-control ids CartPole-v0/v1, "
        "Acrobot-v1, MountainCar-v0, MountainCarContinuous-v0, Pendulum-v1; extra [envpool])",
        ("gymnasium", "vector", "envpool"),
    )
    atari_sticky_actions: bool = flag(
        False,
        "atari_*: sticky actions (the previous action repeats with probability 0.25, Machado et al. 2018)",
    )
    atari_full_action_space: bool = flag(
        False, "atari_*: the full set of 18 actions instead of the game's minimal set", scope=(FIXED,)
    )
    atari_screen_size: int = flag(
        84,
        "atari_*: side of the square grayscale observation after the resize, in pixels (gymnasium's "
        "AtariPreprocessing screen_size; 84 as in Mnih et al. 2015). The small-machine preset's 52 cuts the conv "
        "stack's work ~4x (docs/training.md, 'Settings for Atari on a small machine')",
        scope=(FIXED,),
    )
    res_w: int = flag(
        128, "doom_*: width of the observation after the resize, in pixels (Sample Factory's flag)", scope=(FIXED,)
    )
    res_h: int = flag(
        72, "doom_*: height of the observation after the resize, in pixels (Sample Factory's flag)", scope=(FIXED,)
    )
    wide_aspect_ratio: bool = flag(
        False,
        "doom_*: the engine renders at 256x144 (a wider field of view, slower) instead of 160x120, before the "
        "resize to res_w x res_h (Sample Factory's flag and resolutions)",
    )
    unity_env_path: str | None = flag(
        None,
        "unity_*: the executable of a built Unity ML-Agents scene (one Unity process per env, ports by env index)",
    )
    summaries_use_frameskip: bool = flag(
        True, "Count env frames (steps x frameskip) in the step budget, the curves' x-axis and FPS"
    )
    env_framestack: int | None = flag(
        None,
        "atari_*: observations stack this many of the last frames (default: 4, as Sample Factory's Atari launcher "
        "sets it; other envs stack nothing)",
        scope=(FIXED,),
    )
    eval_env_frameskip: int | None = flag(
        None,
        "msf-enjoy: frames per env step while evaluating (default: env_frameskip); a divisor of env_frameskip: "
        "each action is then repeated env_frameskip / eval_env_frameskip steps, so that the policy sees what it was "
        "trained on and a video shows every frame (doom_*: 1)",
    )
    batched_sampling: bool = flag(
        False,
        "Step each split of a rollout worker's envs as one vectorised env that returns whole arrays (Sample "
        "Factory's flag): msf's --env_backend=envpool (one EnvPool per split, one C++ call per step; refused for "
        "an env that backend does not serve), or --env_backend=vector where that is given",
    )
    decorrelate_experience_max_seconds: int = flag(
        0,
        "Rollout worker i of n waits i / n x this many seconds before its first step, so that the workers' "
        "trajectories end at different times (Sample Factory's flag and meaning; 0: off; not with --benchmark). "
        "Not with --deterministic (it is timed)",
    )
    decorrelate_envs_on_one_worker: bool = flag(
        True,
        "After its first reset, env j of a rollout worker takes j x rollout random actions (drawn from its action "
        "space, seeded by the env's seed), so that the envs of one worker are at different moments of their "
        "episodes (Sample Factory's flag, meaning and default; gymnasium backend). With more than 16 envs per "
        "worker, j x rollout x 16 / num_envs_per_worker: no env takes 16 rollouts or more, so the start-up grows "
        "with the envs, not with their square",
    )
    force_envs_single_thread: bool = flag(
        False,
        "Limit the thread pools of the libraries envs use (OpenMP, BLAS; threadpoolctl) to one thread in each "
        "rollout worker, so that envs that start their own threads do not oversubscribe the cores",
    )
    use_env_info_cache: bool = flag(
        False,
        "Keep the env's spaces in train_dir/experiment/env_info.json after the first start and read them from "
        "there at the next (Sample Factory's flag): a resume does not make an env in the launcher",
    )


@section(LEARNING)
class LearningFlags:
    batch_size: int = flag(
        1024,
        "Samples per minibatch of one learner replica; with N device groups the effective batch is "
        "batch_size x N. Must be a multiple of rollout",
    )
    num_batches_per_epoch: int = flag(
        1, "Minibatches per epoch; one training iteration consumes batch_size x num_batches_per_epoch samples"
    )
    num_epochs: int = flag(1, "Passes over the iteration's samples")
    ppo_clip_ratio: float = flag(
        0.1, "PPO clip: the ratio is clipped to [1/(1+eps), 1+eps] (Sample Factory's convention)"
    )
    ppo_clip_value: float = flag(
        1.0, "Clip of the value change in the clipped value loss (in normalised units with normalize_returns)"
    )
    value_loss_coeff: float = flag(0.5, "Coefficient of the value loss")
    exploration_loss_coeff: float = flag(0.003, "Coefficient of the exploration loss")
    exploration_loss: str = flag(
        "entropy",
        "entropy: maximise the policy's entropy; symmetric_kl (discrete actions): minimise the symmetric KL "
        "divergence between the policy and the uniform distribution, 0.5 (KL(pi||U) + KL(U||pi)), clipped at 30, "
        "which pushes harder away from deterministic policies (Sample Factory's choice for VizDoom)",
        ("entropy", "symmetric_kl"),
    )
    learning_rate: float = flag(1e-4, "Adam learning rate")
    lr_schedule: str = flag(
        "constant",
        "constant; kl_adaptive_minibatch / kl_adaptive_epoch: divide the lr by 1.5 when the KL exceeds 2x "
        "lr_schedule_kl_threshold, multiply it by 1.5 when it is below half of it, after each minibatch / epoch; "
        "linear_decay: from learning_rate down to 0 at train_for_env_steps",
        ("constant", "kl_adaptive_minibatch", "kl_adaptive_epoch", "linear_decay"),
    )
    lr_schedule_kl_threshold: float = flag(0.008, "KL target of the adaptive lr schedules")
    lr_adaptive_min: float = flag(1e-6, "Lowest lr of the adaptive schedules")
    lr_adaptive_max: float = flag(1e-2, "Highest lr of the adaptive schedules")
    adam_eps: float = flag(1e-6, "Adam epsilon")
    adam_beta1: float = flag(0.9, "Adam beta1")
    adam_beta2: float = flag(0.999, "Adam beta2")
    max_grad_norm: float = flag(4.0, "Gradients are clipped to this global L2 norm (0 disables clipping)")
    gamma: float = flag(0.99, "Discount factor")
    gae_lambda: float = flag(0.95, "GAE lambda (Schulman et al. 2016), used when with_vtrace is off")
    with_vtrace: bool = flag(False, "Advantages and value targets by V-trace (Espeholt et al. 2018) instead of GAE")
    vtrace_rho: float = flag(
        1.0, "V-trace rho-bar: clip of the importance weights in the TD errors and policy gradient"
    )
    vtrace_c: float = flag(1.0, "V-trace c-bar: clip of the trace-cutting importance weights")
    reward_scale: float = flag(1.0, "Rewards are multiplied by this before learning")
    reward_clip: float = flag(1000.0, "Scaled rewards are clipped to [-reward_clip, reward_clip]")
    value_bootstrap: bool = flag(
        False,
        "On a truncated (timed-out) episode add gamma x V(last state) to its last reward instead of treating "
        "it as terminal",
    )
    normalize_input: bool = flag(
        True,
        "Normalise observations with a running mean and variance per element, clipped to [-5, 5]: vectors, and "
        "images per pixel and channel after scaling to [0, 1] (as Sample Factory does). Without it images are "
        "only scaled to [0, 1]",
        scope=(FIXED,),
    )
    normalize_returns: bool = flag(
        True, "Train the value head on returns normalised by a running mean and variance", scope=(FIXED,)
    )
    shuffle_minibatches: bool = flag(False, "Shuffle trajectories between minibatches of each epoch")
    optimizer: str = flag(
        "adam",
        "adam (torch.optim.Adam), or lamb: Adam's update rescaled per parameter tensor by the trust ratio "
        "||w|| / ||update|| (You et al. 2020, 'Large Batch Optimization for Deep Learning', Algorithm 2), for "
        "large effective batches",
        ("adam", "lamb"),
    )
    kl_loss_coeff: float = flag(
        0.0,
        "Coefficient of a fixed KL penalty, kl_loss_coeff x mean KL(current policy || behaviour policy), added to "
        "the PPO loss (Schulman et al. 2017, 'Proximal Policy Optimization Algorithms', eq. 8 with a fixed beta); "
        "0: off",
    )
    obs_subtract_mean: float = flag(
        0.0,
        "Observations are (obs - obs_subtract_mean) / obs_scale before the normaliser and the encoder (Sample "
        "Factory's preprocessing); for images, given together with obs_scale",
        scope=(FIXED,),
    )
    obs_scale: float | None = flag(
        None,
        "Divide observations by this (see obs_subtract_mean). Default: 255 for uint8 images (pixels to [0, 1]), "
        "1 for vectors (Sample Factory uses 1 everywhere unless its Atari and Doom launchers set 255)",
        scope=(FIXED,),
    )
    normalize_input_keys: list = flag(
        None,
        "Dict observations: the keys that normalize_input normalises (default: all)",
        item_type=str,
        scope=(FIXED,),
    )


@section(MODEL)
class ModelFlags:
    encoder_mlp_layers: list = flag(
        [512, 512], "Hidden layer sizes of the MLP encoder for vector observations", scope=(FIXED,)
    )
    encoder_conv_architecture: str = flag(
        "convnet_simple",
        "Convolutional encoder for image observations (uint8, 3-D; the smallest dimension is the channels): "
        "convnet_simple (32 8x8/4, 64 4x4/2, 128 3x3/2), convnet_atari (the Nature DQN: 32 8x8/4, 64 4x4/2, "
        "64 3x3/1), convnet_impala (IMPALA's shallow network: 16 8x8/4, 32 4x4/2), resnet_impala (the IMPALA "
        "residual network: 16, 32, 32 channels, works on small images)",
        ("convnet_simple", "convnet_atari", "convnet_impala", "resnet_impala"),
        scope=(FIXED,),
    )
    encoder_conv_mlp_layers: list = flag(
        [512], "Fully connected layers after the convolutional encoder", scope=(FIXED,)
    )
    encoder_custom: str | None = flag(
        None,
        "An encoder registered with msf.model.register_encoder, as 'module:name' (the module registers it at "
        "import); replaces the MLP / conv encoder",
        scope=(FIXED,),
    )
    use_rnn: bool = flag(
        False,
        "A recurrent core after the encoder (with --actor_critic_share_weights=False, one for the actor and one for "
        "the critic); its state is kept per env in the trajectory buffer and reset at episode ends",
        scope=(FIXED,),
    )
    rnn_type: str = flag("gru", "Type of the recurrent core", ("gru", "lstm"), scope=(FIXED,))
    rnn_size: int = flag(512, "Size of the recurrent core's state", scope=(FIXED,))
    rnn_num_layers: int = flag(1, "Layers of the recurrent core", scope=(FIXED,))
    nonlinearity: str = flag("elu", "Activation of the encoder", ("elu", "relu", "tanh"), scope=(FIXED,))
    actor_critic_share_weights: bool = flag(
        True,
        "One encoder, recurrent core and decoder for actor and critic (False: each has its own, as in Sample "
        "Factory; the recurrent state per env is then twice as large, the actor's then the critic's)",
        scope=(FIXED,),
    )
    policy_initialization: str = flag(
        "orthogonal",
        "Weight initialisation of the linear and convolutional layers (biases zero; the recurrent core keeps "
        "torch's own)",
        ("orthogonal", "xavier_uniform", "torch_default"),
    )
    policy_init_gain: float = flag(1.0, "Gain of the orthogonal / xavier initialisation")
    action_head_init_gain: float | None = flag(
        None,
        "Gain of the action head's initialisation (its last linear layer). Default: policy_init_gain, as Sample "
        "Factory initialises every layer; 0.01 starts from a near-uniform policy (Andrychowicz et al. 2021, "
        "'What Matters in On-Policy RL', sec. 3.2), which learned doom_basic in about twice the frames",
    )
    initial_stddev: float = flag(1.0, "Initial standard deviation of the Gaussian action head (continuous actions)")
    adaptive_stddev: bool = flag(
        True,
        "Continuous actions: the action head outputs a log standard deviation per action for each state (True, "
        "Sample Factory's default) or a learned log standard deviation independent of the state (False; "
        "mujoco_*: False)",
        scope=(FIXED,),
    )
    continuous_tanh_scale: float = flag(
        0.0,
        "Continuous actions: squash the Gaussian's mean to scale x tanh(mean / scale) (0: no squashing)",
    )
    decoder_mlp_layers: list = flag(
        [],
        "Hidden layers after the encoder and the recurrent core, before the heads (empty: none; with "
        "--actor_critic_share_weights=False, the actor and the critic each have their own)",
        scope=(FIXED,),
    )


@section(DISTRIBUTED)
class DistributedFlags:
    nproc_per_node: int | None = flag(
        None,
        "Device groups on this machine, each with its own learner replica (gradients averaged with DDP), "
        "inference workers, trajectory buffer and share of the rollout workers. Default: one per visible GPU "
        "with --device=gpu, else 1. With --device=cpu, N CPU device groups. The effective batch is "
        "batch_size x world size",
        scope=(LAUNCH,),
    )
    dist_timeout: int = flag(
        300,
        "Seconds a replica waits for the others (joining, and in every collective) before the job fails",
    )
    nnodes: int = flag(
        1,
        "Nodes (machines) in the job; world size = nnodes x nproc_per_node. Under torchrun or inside a Slurm "
        "allocation it is read from their environment",
    )
    node_rank: int = flag(
        0,
        "This node's index in [0, nnodes): rank = node_rank x nproc_per_node + local_rank",
        scope=(PER_NODE,),
    )
    hosts: str | None = flag(
        None,
        "Comma-separated host names or addresses of the nodes, in node-rank order (a static rendezvous): the "
        "first one hosts the rendezvous and rank 0. Needs --nnodes=len(hosts)",
    )
    master_port: int = flag(
        0,
        "TCP port of the rendezvous, on the first host (one node: 127.0.0.1); 0: 29500 with several nodes, a "
        "free port on one node",
        scope=(LAUNCH,),
    )
    max_restarts: int = flag(
        0,
        "After a failure, restart the job's device groups from the last checkpoint up to this many times "
        "(torchrun's meaning)",
    )
    ddp_check_interval: int = flag(
        100,
        "Iterations between checksums of every replica's parameters, optimiser state and normalisers (0: only "
        "at start-up)",
    )


SAMPLER_NODES = "sampler nodes (CPU machines that feed this job's learner)"


@section(SAMPLER_NODES)
class SamplerNodeFlags:
    sampler_port: int = flag(
        0,
        "TCP port where sampler nodes (msf-sampler --connect=HOST:PORT) join this job and send it trajectories; "
        "0: none can join. Device group R listens on this port + R (one node: nnodes=1); a sampler node connects "
        "to this one and spreads its trajectories over all groups",
        scope=(LAUNCH,),
    )
    sampler_bind: str | None = flag(
        None,
        "Address the sampler port listens on; default: the rendezvous address (127.0.0.1 on one node: give this "
        "host's address, or 0.0.0.0 for every interface, to let other machines in)",
        scope=(LAUNCH,),
    )
    sampler_key_file: str | None = flag(
        None,
        "File holding the key that signs every message to and from sampler nodes (HMAC-SHA256); default: a new "
        "key in TRAIN_DIR/EXPERIMENT/sampler.key (mode 0600), which msf-sampler then needs",
        scope=(LAUNCH,),
    )


@section(POLICIES)
class PolicyFlags:
    num_policies: int = flag(
        1,
        "Policies trained at once; every device group holds a learner replica of each, and every agent of every "
        "env is driven by one of them (see pbt_mix_policies_in_one_env)",
        scope=(FIXED,),
    )
    pbt_mix_policies_in_one_env: bool = flag(
        True,
        "Draw a policy per agent (True) or one per env for all its agents (False); drawn again at the first "
        "trajectory boundary after the env's episode ends",
    )
    with_pbt: bool = flag(False, "Population-based training over the num_policies policies (Jaderberg et al. 2017)")
    pbt_period_env_steps: int = flag(
        5_000_000,
        "PBT: consider replacing policies every this many env steps (frames with summaries_use_frameskip)",
    )
    pbt_start_mutation: int = flag(
        20_000_000, "PBT: no replacement before this many env steps (frames with summaries_use_frameskip)"
    )
    pbt_replace_fraction: float = flag(
        0.3, "PBT: the worst this fraction of policies may be replaced by copies of the best this fraction"
    )
    pbt_mutation_rate: float = flag(0.15, "PBT: probability that each hyperparameter of a replaced policy is perturbed")
    pbt_replace_reward_gap: float = flag(
        0.1,
        "PBT: replace only when the donor's objective beats the replaced policy's by this fraction of its "
        "absolute value",
    )
    pbt_replace_reward_gap_absolute: float = flag(1e-6, "PBT: ... and by at least this much")
    pbt_perturb_min: float = flag(
        1.1,
        "PBT: a perturbed hyperparameter is multiplied or divided by a factor drawn from [pbt_perturb_min, "
        "pbt_perturb_max]",
    )
    pbt_perturb_max: float = flag(1.5, "PBT: see pbt_perturb_min")
    pbt_optimize_gamma: bool = flag(
        False, "PBT: also perturb the discount gamma (kept in [0.9, 0.9999]; the other hyperparameters always)"
    )
    pbt_target_objective: str = flag(
        "true_objective",
        "PBT: the statistic Sample Factory compares; accepted for its command lines, but msf optimises the mean "
        "episode return of the last stats_avg episodes whatever the value (an env's info['true_objective'] is "
        "not read)",
        ("true_objective", "reward"),
    )


@section(STOPPING)
class StoppingFlags:
    train_for_env_steps: int = flag(
        10_000_000_000, "Stop after this many env steps (env frames with summaries_use_frameskip)"
    )
    train_for_seconds: int = flag(10_000_000_000, "Stop after this many seconds of training")
    stop_at_return_mean: float | None = flag(
        None,
        "Stop (status done) once the mean return of the job's last stats_avg episodes (the status line's "
        "return_mean; with several policies, the best of them) reaches this, checked at each summary: every "
        "experiment_summaries_interval seconds, every iteration with --deterministic (default: no target)",
    )


@section(PERSISTENCE)
class PersistenceFlags:
    save_every_sec: int = flag(120, "Seconds between checkpoints (one is also written at the end and on a clean stop)")
    keep_checkpoints: int = flag(2, "Number of newest checkpoints kept")
    save_milestones_sec: int = flag(
        -1, "Keep a checkpoint every this many seconds forever, in checkpoint_p0/milestones (-1: never)"
    )
    save_best_every_sec: int = flag(5, "Seconds at least between two writes of the best checkpoint")
    save_best_after: int = flag(
        100_000,
        "Keep the best checkpoint (checkpoint_p0/best_*.pth) only after this many env steps (frames with "
        "summaries_use_frameskip)",
    )
    save_best_metric: str = flag(
        "reward",
        "Metric of the best checkpoint: reward (the mean episode return of the last stats_avg episodes, higher "
        "is better)",
        ("reward",),
    )
    experiment_summaries_interval: int = flag(10, "Seconds between TensorBoard summaries and log status lines")
    stats_avg: int = flag(
        100,
        "Episodes averaged in episode_return_mean and the other episode statistics: the job's last stats_avg, "
        "taken in equal shares from the device groups",
    )
    with_progress_bar: bool = flag(True, "Show a progress bar when the console is a terminal", scope=(LAUNCH, PER_NODE))
    with_wandb: bool = flag(
        False,
        "Also log the summaries to Weights & Biases (pip install 'multi-sample-factory[wandb]'; "
        "WANDB_MODE=offline works without an account)",
    )
    wandb_user: str | None = flag(
        None, "Weights & Biases entity (user or team) (default: the one your W&B account is set to)"
    )
    wandb_project: str = flag("multi_sample_factory", "Weights & Biases project")
    wandb_group: str | None = flag(None, "Weights & Biases group (default: the env's name)")
    wandb_job_type: str = flag("SF", "Weights & Biases job type")
    wandb_tags: list = flag([], "Weights & Biases tags (space separated)", item_type=str)
    log_to_file: bool = flag(True, "Write the log to train_dir/experiment/log.txt as well as to the console")
    flush_summaries_interval: int = flag(30, "Seconds at most between writes of the TensorBoard event files to disk")
    heartbeat_interval: int = flag(
        20,
        "Seconds without a new trajectory after which the rollout workers count as stalled (Sample Factory's "
        "heartbeat of its components, mapped onto msf's supervision: a dead or failed worker ends the run at once "
        "whatever this says; a stalled one is named in a warning, see heartbeat_reporting_interval)",
    )
    heartbeat_reporting_interval: int = flag(
        180,
        "Seconds between two warnings about stalled rollout workers (each names the workers that wrote no env step "
        "since the last one)",
    )
    benchmark: bool = flag(
        False,
        "Benchmark mode (Sample Factory's flag and meaning): the rollout workers start at once, without the delay of "
        "--decorrelate_experience_max_seconds",
    )


@section(SAMPLING)
class DeviceEnvFlags:
    """Sample Factory's flags of envs whose tensors live on a device (``docs/device_envs.md``); the rules of their
    combinations are :func:`msf.envs.device_env.resolve_device_env`'s."""

    env_gpu_actions: bool = flag(
        False,
        "The env takes its actions as torch tensors on the device group's device: True with an env registered by "
        "msf.envs.register_device_env, which each device group then steps in its own process, --num_envs_per_worker "
        "instances at a time (refused with any other env)",
    )
    env_gpu_observations: bool = flag(
        True,
        "The env's observations stay on the device, from env to policy to learner: must be True with a device-side "
        "env; a CPU env's NumPy observations go through the shared-memory buffer whatever its value",
    )
    actor_worker_gpus: list = flag(
        [],
        "Sample Factory: GPUs of the rollout workers. Refused: msf's rollout workers step CPU envs, and a "
        "device-side env steps on its device group's own device",
    )


IGNORED = {
    "use_record_episode_statistics": "msf-enjoy always counts whole games: its envs leave out the training-only "
    "wrappers (an Atari life lost is not an episode end there)",
    "pixel_format": "msf's convolutional encoders find the channel axis of an image themselves (its smallest "
    "dimension), so CHW and HWC observations train alike; a custom encoder gets the env's own layout",
    "train_script": "it names the training script in a Hugging Face model card, and msf does not push to the hub",
    "enjoy_script": "it names the evaluation script in a Hugging Face model card, and msf does not push to the hub",
    "hf_repository": "it names the Hugging Face repository of --push_to_hub, which msf does not have",
    "push_to_hub": "msf does not upload to the Hugging Face hub (msf-enjoy refuses it with one line)",
}
"""Why each accepted Sample Factory flag has no effect in msf (also the msf-enjoy flags that msf-train accepts, and
the Hugging Face ones), by flag name."""


@section(EVALUATION)
class EvaluationFlags:
    """The flags of ``msf-enjoy`` beyond the training config (Sample Factory's names). ``msf-train`` accepts and
    ignores them (Sample Factory's scripts share them); they are never part of a saved config."""

    load_checkpoint_kind: str = flag(
        "latest",
        "latest: the newest periodic checkpoint; best: the one with the best --save_best_metric",
        ("latest", "best"),
    )
    policy_index: int = flag(
        0, "Which policy of a --num_policies run to play (its checkpoint_p{i}/), in [0, num_policies)"
    )
    max_num_episodes: int = flag(10, "Episodes to play")
    max_num_frames: int = flag(
        10**9, "Stop after this many env frames (env steps x env_frameskip), even within an episode"
    )
    eval_deterministic: bool = flag(False, "Take the most likely action (the mean of a Gaussian) instead of sampling")
    save_video: bool = flag(False, "Write the episodes to an mp4 (rendered off-screen, no display needed)")
    video_frames: int = flag(
        10**9, "Frames written to the video at most; -1: the first episode (Sample Factory's meaning)"
    )
    video_name: str | None = flag(
        None, "File name of the video in the experiment folder (default replay.mp4), or a path"
    )
    no_render: bool = flag(False, "Do not show the episodes in a window (without a display nothing is shown anyway)")
    fps: int = flag(
        0,
        "Frames per second of the video and of the window (0: real time, one frame per env step: the env's "
        "render_fps, or 30 without one; atari_* 15 and doom_* 8.75, their 60 and 35 frames/s over 4 frames per step)",
    )
    push_to_hub: bool = flag(
        False,
        "Sample Factory's upload of the experiment to the Hugging Face hub: refused (msf has no hub upload)",
    )
    hf_repository: str | None = flag(None, f"Accepted from Sample Factory and ignored: {IGNORED['hf_repository']}")
    train_script: str | None = flag(None, f"Accepted from Sample Factory and ignored: {IGNORED['train_script']}")
    enjoy_script: str | None = flag(None, f"Accepted from Sample Factory and ignored: {IGNORED['enjoy_script']}")


@section(COMPAT)
class CompatFlags:
    """Sample Factory 2 flags that msf accepts so that its command lines and config.json files keep working, but
    that change nothing here (:data:`IGNORED` says why; ``msf-train`` says it once in the log when one is given)."""

    use_record_episode_statistics: bool = flag(
        False,
        "Sample Factory: count msf-enjoy's episodes by RecordEpisodeStatistics. No effect: "
        + IGNORED["use_record_episode_statistics"],
    )
    pixel_format: str = flag(
        "CHW", f"Sample Factory: the layout of images. No effect: {IGNORED['pixel_format']}", ("CHW", "HWC")
    )
