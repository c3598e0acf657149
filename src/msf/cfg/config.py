"""The typed configuration: every flag, its Sample Factory name, default and meaning.

One dataclass holds every flag. Each field carries its help text and its
``--help`` group in ``metadata``; :mod:`msf.cfg.arguments` builds the command line
from these fields, and :mod:`msf.cfg.validation` checks them once, before any
process is spawned. Values derived from flags (the rollout workers' env split,
trajectories per batch, ...) live in :class:`Derived`, computed in one place.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any


def _f(default: Any, help: str, group: str, choices: tuple | None = None, item_type: type = int) -> Any:
    meta = {"help": help, "group": group, "choices": choices, "item_type": item_type}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


BASIC = "basic"
SAMPLING = "sampling (rollout and inference workers)"
LEARNING = "learning (PPO, advantages, optimiser)"
MODEL = "model"
STOPPING = "stopping"
PERSISTENCE = "checkpoints and summaries"
DISTRIBUTED = "distributed (data-parallel learners)"
POLICIES = "several policies and population-based training"


@dataclass
class Config:
    """All flags of ``msf-train``. Names, meanings and defaults follow Sample Factory 2."""

    # --- basic ---
    env: str = _f(
        "CartPole-v1", "Environment: a gymnasium id (also 'module:Id'), or a name given to register_env", BASIC
    )
    experiment: str = _f("default_experiment", "Experiment name; results go to train_dir/experiment", BASIC)
    train_dir: str = _f("./train_dir", "Root folder of all experiments", BASIC)
    restart_behavior: str = _f(
        "resume",
        "resume: continue from the latest checkpoint of the experiment; restart: move the old experiment "
        "folder aside and start anew; overwrite: delete it and start anew",
        BASIC,
        ("resume", "restart", "overwrite"),
    )
    device: str = _f(
        "gpu",
        "Device of the learner and inference workers: gpu (falls back to cpu when CUDA is not available) or cpu",
        BASIC,
        ("gpu", "cpu"),
    )
    seed: int | None = _f(
        None, "Seed of the model initialisation and of the environments (random when not given)", BASIC
    )

    # --- sampling ---
    num_workers: int = _f(
        os.cpu_count() or 1,
        "Rollout worker processes on this machine; the default is the number of CPU cores",
        SAMPLING,
    )
    num_envs_per_worker: int = _f(2, "Environments stepped by each rollout worker", SAMPLING)
    worker_num_splits: int = _f(
        2,
        "Groups the envs of a worker are split into for double-buffered sampling: while one group waits "
        "for actions the other steps. Must divide num_envs_per_worker",
        SAMPLING,
    )
    policy_workers_per_policy: int = _f(
        1, "Inference worker processes per policy; rollout workers are assigned to them round-robin", SAMPLING
    )
    rollout: int = _f(32, "Length of the trajectories written to the trajectory buffer, in env steps", SAMPLING)
    recurrence: int = _f(
        -1,
        "Length of the sequences the learner re-runs the recurrent core over (backpropagation through time); -1: rollout with --use_rnn, else 1. Must divide rollout",
        SAMPLING,
    )
    num_batches_to_accumulate: int = _f(
        2,
        "How many training iterations of finished trajectories the rollout workers may hold beyond the one the learner is taking (their spare buffer slots). When sampling outruns the learner, the policy lag grows with it: 1 keeps the experience fresher, 2 keeps the learner fed",
        SAMPLING,
    )
    max_policy_lag: int = _f(
        1000,
        "Trajectories whose oldest action is more than this many policy versions old are dropped (and counted)",
        SAMPLING,
    )
    learner_threads: int = _f(
        0,
        "torch threads of each learner replica. 0: start with the cores left when every rollout and inference worker of the node holds one (at least 1), then, at the first summary 30 s in, set them once from the measured load: the replica's share of the cores minus what its workers kept busy (kept when the learner waits > 10%%). On 2 cores atari_pong goes to 2 threads (1,240 vs 1,000 frames/s), doom_basic stays at 1",
        SAMPLING,
    )
    set_workers_cpu_affinity: bool = _f(
        True,
        "Pin each rollout worker to one CPU core: worker i of the node (counted over its device groups) goes to the (i mod n)-th of the n cores this process may use (os.sched_getaffinity: all cores, or those of taskset or a Slurm allocation), when the workers spread evenly: at most one per core, or a multiple of n. ViZDoom runs at about half speed unpinned",
        SAMPLING,
    )
    default_niceness: int = _f(
        0,
        "Niceness of the learner (Sample Factory's flag); inference workers run 2 and rollout workers 10 above it when there is more than one rollout worker, so that on a busy machine the learner keeps its core. 0 leaves the learner as started; below the current niceness needs privileges",
        SAMPLING,
    )
    env_frameskip: int = _f(
        1,
        "Frames covered by one env step, for counting env frames (gymnasium envs: 1; atari_* and doom_*: 4 unless given)",
        SAMPLING,
    )
    env_backend: str = _f(
        "gymnasium",
        "How rollout workers step their envs: gymnasium (one env object each, a Python loop) or envpool (one EnvPool per split of a worker, one C++ call; atari_* and mujoco_*, extra [envpool])",
        SAMPLING,
        ("gymnasium", "envpool"),
    )
    atari_sticky_actions: bool = _f(
        False,
        "atari_*: sticky actions (the previous action repeats with probability 0.25, Machado et al. 2018)",
        SAMPLING,
    )
    atari_full_action_space: bool = _f(
        False, "atari_*: the full set of 18 actions instead of the game's minimal set", SAMPLING
    )
    res_w: int = _f(
        128, "doom_*: width of the observation after the resize, in pixels (Sample Factory's flag)", SAMPLING
    )
    res_h: int = _f(
        72, "doom_*: height of the observation after the resize, in pixels (Sample Factory's flag)", SAMPLING
    )
    wide_aspect_ratio: bool = _f(
        False,
        "doom_*: the engine renders at 256x144 (a wider field of view, slower) instead of 160x120, before the resize to res_w x res_h (Sample Factory's flag and resolutions)",
        SAMPLING,
    )
    unity_env_path: str | None = _f(
        None,
        "unity_*: the executable of a built Unity ML-Agents scene (one Unity process per env, ports by env index)",
        SAMPLING,
    )
    summaries_use_frameskip: bool = _f(
        True, "Count env frames (steps x frameskip) in the step budget, the curves' x-axis and FPS", SAMPLING
    )

    # --- learning ---
    batch_size: int = _f(
        1024,
        "Samples per minibatch of one learner replica; with N device groups the effective batch is batch_size x N. Must be a multiple of rollout",
        LEARNING,
    )
    num_batches_per_epoch: int = _f(
        1, "Minibatches per epoch; one training iteration consumes batch_size x num_batches_per_epoch samples", LEARNING
    )
    num_epochs: int = _f(1, "Passes over the iteration's samples", LEARNING)
    ppo_clip_ratio: float = _f(
        0.1, "PPO clip: the ratio is clipped to [1/(1+eps), 1+eps] (Sample Factory's convention)", LEARNING
    )
    ppo_clip_value: float = _f(
        1.0, "Clip of the value change in the clipped value loss (in normalised units with normalize_returns)", LEARNING
    )
    value_loss_coeff: float = _f(0.5, "Coefficient of the value loss", LEARNING)
    exploration_loss_coeff: float = _f(0.003, "Coefficient of the exploration loss", LEARNING)
    exploration_loss: str = _f(
        "entropy",
        "entropy: maximise the policy's entropy; symmetric_kl (discrete actions): minimise the symmetric KL divergence between the policy and the uniform distribution, 0.5 (KL(pi||U) + KL(U||pi)), clipped at 30, which pushes harder away from deterministic policies (Sample Factory's choice for VizDoom)",
        LEARNING,
        ("entropy", "symmetric_kl"),
    )
    learning_rate: float = _f(1e-4, "Adam learning rate", LEARNING)
    lr_schedule: str = _f(
        "constant",
        "constant; kl_adaptive_minibatch / kl_adaptive_epoch: divide the lr by 1.5 when the KL exceeds 2x "
        "lr_schedule_kl_threshold, multiply it by 1.5 when it is below half of it, after each minibatch / epoch; "
        "linear_decay: from learning_rate down to 0 at train_for_env_steps",
        LEARNING,
        ("constant", "kl_adaptive_minibatch", "kl_adaptive_epoch", "linear_decay"),
    )
    lr_schedule_kl_threshold: float = _f(0.008, "KL target of the adaptive lr schedules", LEARNING)
    lr_adaptive_min: float = _f(1e-6, "Lowest lr of the adaptive schedules", LEARNING)
    lr_adaptive_max: float = _f(1e-2, "Highest lr of the adaptive schedules", LEARNING)
    adam_eps: float = _f(1e-6, "Adam epsilon", LEARNING)
    adam_beta1: float = _f(0.9, "Adam beta1", LEARNING)
    adam_beta2: float = _f(0.999, "Adam beta2", LEARNING)
    max_grad_norm: float = _f(4.0, "Gradients are clipped to this global L2 norm (0 disables clipping)", LEARNING)
    gamma: float = _f(0.99, "Discount factor", LEARNING)
    gae_lambda: float = _f(0.95, "GAE lambda (Schulman et al. 2016), used when with_vtrace is off", LEARNING)
    with_vtrace: bool = _f(
        False, "Advantages and value targets by V-trace (Espeholt et al. 2018) instead of GAE", LEARNING
    )
    vtrace_rho: float = _f(
        1.0, "V-trace rho-bar: clip of the importance weights in the TD errors and policy gradient", LEARNING
    )
    vtrace_c: float = _f(1.0, "V-trace c-bar: clip of the trace-cutting importance weights", LEARNING)
    reward_scale: float = _f(1.0, "Rewards are multiplied by this before learning", LEARNING)
    reward_clip: float = _f(1000.0, "Scaled rewards are clipped to [-reward_clip, reward_clip]", LEARNING)
    value_bootstrap: bool = _f(
        False,
        "On a truncated (timed-out) episode add gamma x V(last state) to its last reward instead of treating it as terminal",
        LEARNING,
    )
    normalize_input: bool = _f(
        True,
        "Normalise observations with a running mean and variance per element, clipped to [-5, 5]: vectors, and images per pixel and channel after scaling to [0, 1] (as Sample Factory does). Without it images are only scaled to [0, 1]",
        LEARNING,
    )
    normalize_returns: bool = _f(
        True, "Train the value head on returns normalised by a running mean and variance", LEARNING
    )
    shuffle_minibatches: bool = _f(False, "Shuffle trajectories between minibatches of each epoch", LEARNING)

    # --- model ---
    encoder_mlp_layers: list = _f([512, 512], "Hidden layer sizes of the MLP encoder for vector observations", MODEL)
    encoder_conv_architecture: str = _f(
        "convnet_simple",
        "Convolutional encoder for image observations (uint8, 3-D; the smallest dimension is the channels): "
        "convnet_simple (32 8x8/4, 64 4x4/2, 128 3x3/2), convnet_atari (the Nature DQN: 32 8x8/4, 64 4x4/2, "
        "64 3x3/1), resnet_impala (the IMPALA residual network: 16, 32, 32 channels, works on small images)",
        MODEL,
        ("convnet_simple", "convnet_atari", "resnet_impala"),
    )
    encoder_conv_mlp_layers: list = _f([512], "Fully connected layers after the convolutional encoder", MODEL)
    encoder_custom: str | None = _f(
        None,
        "An encoder registered with msf.model.register_encoder, as 'module:name' (the module registers it at import); replaces the MLP / conv encoder",
        MODEL,
    )
    use_rnn: bool = _f(
        False,
        "A recurrent core after the encoder; its state is kept per env in the trajectory buffer and reset at episode ends",
        MODEL,
    )
    rnn_type: str = _f("gru", "Type of the recurrent core", MODEL, ("gru", "lstm"))
    rnn_size: int = _f(512, "Size of the recurrent core's state", MODEL)
    rnn_num_layers: int = _f(1, "Layers of the recurrent core", MODEL)
    nonlinearity: str = _f("elu", "Activation of the encoder", MODEL, ("elu", "relu", "tanh"))
    actor_critic_share_weights: bool = _f(
        True, "One encoder for actor and critic (False: two separate encoders)", MODEL
    )
    policy_initialization: str = _f(
        "orthogonal",
        "Weight initialisation of the linear and convolutional layers (biases zero; the recurrent core keeps torch's own)",
        MODEL,
        ("orthogonal", "xavier_uniform", "torch_default"),
    )
    policy_init_gain: float = _f(1.0, "Gain of the orthogonal / xavier initialisation", MODEL)
    initial_stddev: float = _f(
        1.0, "Initial standard deviation of the Gaussian action head (continuous actions)", MODEL
    )

    # --- distributed ---
    nproc_per_node: int | None = _f(
        None,
        "Device groups on this machine, each with its own learner replica (gradients averaged with DDP), "
        "inference workers, trajectory buffer and share of the rollout workers. Default: one per visible GPU "
        "with --device=gpu, else 1. With --device=cpu, N CPU device groups. The effective batch is "
        "batch_size x world size",
        DISTRIBUTED,
    )
    dist_timeout: int = _f(
        300,
        "Seconds a replica waits for the others (joining, and in every collective) before the job fails",
        DISTRIBUTED,
    )
    nnodes: int = _f(
        1,
        "Nodes (machines) in the job; world size = nnodes x nproc_per_node. Under torchrun or inside a Slurm allocation it is read from their environment",
        DISTRIBUTED,
    )
    node_rank: int = _f(
        0, "This node's index in [0, nnodes): rank = node_rank x nproc_per_node + local_rank", DISTRIBUTED
    )
    hosts: str | None = _f(
        None,
        "Comma-separated host names or addresses of the nodes, in node-rank order (a static rendezvous): the first one hosts the rendezvous and rank 0. Needs --nnodes=len(hosts)",
        DISTRIBUTED,
    )
    master_port: int = _f(
        0,
        "TCP port of the rendezvous, on the first host (one node: 127.0.0.1); 0: 29500 with several nodes, a free port on one node",
        DISTRIBUTED,
    )
    max_restarts: int = _f(
        0,
        "After a failure, restart the job's device groups from the last checkpoint up to this many times (torchrun's meaning)",
        DISTRIBUTED,
    )
    ddp_check_interval: int = _f(
        100,
        "Iterations between checksums of every replica's parameters, optimiser state and normalisers (0: only at start-up)",
        DISTRIBUTED,
    )

    # --- several policies, PBT ---
    num_policies: int = _f(
        1,
        "Policies trained at once; every device group holds a learner replica of each, and every agent of every env is driven by one of them (see pbt_mix_policies_in_one_env)",
        POLICIES,
    )
    pbt_mix_policies_in_one_env: bool = _f(
        True,
        "Draw a policy per agent (True) or one per env for all its agents (False); drawn again at the first trajectory boundary after the env's episode ends",
        POLICIES,
    )
    with_pbt: bool = _f(
        False, "Population-based training over the num_policies policies (Jaderberg et al. 2017)", POLICIES
    )
    pbt_period_env_steps: int = _f(
        5_000_000,
        "PBT: consider replacing policies every this many env steps (frames with summaries_use_frameskip)",
        POLICIES,
    )
    pbt_start_mutation: int = _f(
        20_000_000, "PBT: no replacement before this many env steps (frames with summaries_use_frameskip)", POLICIES
    )
    pbt_replace_fraction: float = _f(
        0.3, "PBT: the worst this fraction of policies may be replaced by copies of the best this fraction", POLICIES
    )
    pbt_mutation_rate: float = _f(
        0.15, "PBT: probability that each hyperparameter of a replaced policy is perturbed", POLICIES
    )
    pbt_replace_reward_gap: float = _f(
        0.1,
        "PBT: replace only when the donor's objective beats the replaced policy's by this fraction of its absolute value",
        POLICIES,
    )
    pbt_replace_reward_gap_absolute: float = _f(1e-6, "PBT: ... and by at least this much", POLICIES)
    pbt_perturb_min: float = _f(
        1.1,
        "PBT: a perturbed hyperparameter is multiplied or divided by a factor drawn from [pbt_perturb_min, pbt_perturb_max]",
        POLICIES,
    )
    pbt_perturb_max: float = _f(1.5, "PBT: see pbt_perturb_min", POLICIES)
    pbt_target_objective: str = _f(
        "true_objective",
        "PBT: what is compared (Sample Factory's names). msf compares the mean episode return of the last stats_avg episodes for both values: an env's info['true_objective'] is not read yet",
        POLICIES,
        ("true_objective", "reward"),
    )

    # --- stopping ---
    train_for_env_steps: int = _f(
        10_000_000_000, "Stop after this many env steps (env frames with summaries_use_frameskip)", STOPPING
    )
    train_for_seconds: int = _f(10_000_000_000, "Stop after this many seconds of training", STOPPING)

    # --- persistence ---
    save_every_sec: int = _f(
        120, "Seconds between checkpoints (one is also written at the end and on a clean stop)", PERSISTENCE
    )
    keep_checkpoints: int = _f(2, "Number of newest checkpoints kept", PERSISTENCE)
    save_milestones_sec: int = _f(
        -1, "Keep a checkpoint every this many seconds forever, in checkpoint_p0/milestones (-1: never)", PERSISTENCE
    )
    save_best_every_sec: int = _f(5, "Seconds at least between two writes of the best checkpoint", PERSISTENCE)
    save_best_after: int = _f(
        100_000,
        "Keep the best checkpoint (checkpoint_p0/best_*.pth) only after this many env steps (frames with summaries_use_frameskip)",
        PERSISTENCE,
    )
    save_best_metric: str = _f(
        "reward",
        "Metric of the best checkpoint: reward (the mean episode return of the last stats_avg episodes, higher is better)",
        PERSISTENCE,
        ("reward",),
    )
    experiment_summaries_interval: int = _f(
        10, "Seconds between TensorBoard summaries and log status lines", PERSISTENCE
    )
    stats_avg: int = _f(100, "Episodes averaged in episode_return_mean and the other episode statistics", PERSISTENCE)
    with_progress_bar: bool = _f(True, "Show a progress bar when the console is a terminal", PERSISTENCE)
    with_wandb: bool = _f(
        False,
        "Also log the summaries to Weights & Biases (pip install 'multi-sample-factory[wandb]'; WANDB_MODE=offline works without an account)",
        PERSISTENCE,
    )
    wandb_user: str | None = _f(
        None, "Weights & Biases entity (user or team); default: your default entity", PERSISTENCE
    )
    wandb_project: str = _f("multi_sample_factory", "Weights & Biases project", PERSISTENCE)
    wandb_group: str | None = _f(None, "Weights & Biases group (default: the env's name)", PERSISTENCE)
    wandb_job_type: str = _f("SF", "Weights & Biases job type", PERSISTENCE)
    wandb_tags: list = _f([], "Weights & Biases tags (space separated)", PERSISTENCE, item_type=str)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class Derived:
    """Values computed from a :class:`Config`; never set by hand.

    Attributes:
        recurrence: effective recurrence (``cfg.recurrence`` with -1 resolved).
        envs_per_split: envs in one split of a rollout worker.
        trajectories_per_batch: trajectories of ``rollout`` steps in one minibatch.
        trajectories_per_iteration: trajectories one training iteration consumes.
        slots_per_worker: trajectory-buffer slots owned by each rollout worker: one being
            written per agent of each env, plus spares so that the workers can hold
            ``num_batches_to_accumulate`` iterations of finished trajectories (at least one per agent).
        frameskip: frames per env step used for counting (1 without summaries_use_frameskip).
        num_agents: agents per env (1, or a multi-agent env's ``num_agents``).
        rnn_state_size: floats of recurrent state per agent (0 without ``use_rnn``; GRU ``L x H``,
            LSTM ``2 x L x H``).
    """

    recurrence: int
    envs_per_split: int
    trajectories_per_batch: int
    trajectories_per_iteration: int
    slots_per_worker: int
    frameskip: int
    rnn_state_size: int = 0
    num_agents: int = 1

    @property
    def agents_per_split(self) -> int:
        """Agents (trajectory rows) in one split: ``envs_per_split x num_agents``."""
        return self.envs_per_split * self.num_agents

    @classmethod
    def of(cls, cfg: Config, num_agents: int = 1) -> "Derived":
        """``num_agents``: agents per env (:attr:`msf.envs.registry.EnvSpaces.num_agents`); every agent of
        every env writes its own trajectories."""
        recurrence = (cfg.rollout if cfg.use_rnn else 1) if cfg.recurrence == -1 else cfg.recurrence
        per_batch = cfg.batch_size // cfg.rollout
        per_iter = per_batch * cfg.num_batches_per_epoch
        agents_per_worker = cfg.num_envs_per_worker * num_agents
        spare = max(agents_per_worker, -(-cfg.num_batches_to_accumulate * per_iter // cfg.num_workers))
        return cls(
            recurrence=recurrence,
            envs_per_split=cfg.num_envs_per_worker // cfg.worker_num_splits,
            trajectories_per_batch=per_batch,
            trajectories_per_iteration=per_iter,
            slots_per_worker=agents_per_worker + spare,
            frameskip=cfg.env_frameskip if cfg.summaries_use_frameskip else 1,
            rnn_state_size=(cfg.rnn_num_layers * cfg.rnn_size * (2 if cfg.rnn_type == "lstm" else 1))
            if cfg.use_rnn
            else 0,
            num_agents=num_agents,
        )
