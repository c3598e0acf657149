"""The typed configuration: every flag, its Sample Factory name, default and meaning.

:class:`Config` holds every flag. Its fields come from the section dataclasses of :mod:`msf.cfg.flags`
(one per ``--help`` group); each field carries its help text, group and scopes in ``metadata``.
:mod:`msf.cfg.arguments` builds the command line from these fields, and :mod:`msf.cfg.validation` checks
them once, before any process is spawned. The sets of flags that share a scope are derived here, once:
:data:`LAUNCH_FLAGS`, :data:`FIXED_FLAGS`, :data:`PER_NODE_FLAGS`. Values derived from flags (the rollout
workers' env split, trajectories per batch, ...) live in :class:`Derived`, computed in one place.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from msf.cfg.flags import (
    FIXED,
    LAUNCH,
    PER_NODE,
    BasicFlags,
    CompatFlags,
    DeviceEnvFlags,
    DistributedFlags,
    LearningFlags,
    ModelFlags,
    PersistenceFlags,
    PolicyFlags,
    SamplerNodeFlags,
    SamplingFlags,
    StoppingFlags,
)


# A dataclass takes the fields of its bases in reverse order of the bases: listed last to first here,
# the flags (and --help, and config.json) run basic, sampling, learning, model, distributed, policies,
# stopping, persistence, and last the Sample Factory flags that change nothing.
@dataclass
class Config(
    CompatFlags,
    DeviceEnvFlags,
    PersistenceFlags,
    StoppingFlags,
    PolicyFlags,
    SamplerNodeFlags,
    DistributedFlags,
    ModelFlags,
    LearningFlags,
    SamplingFlags,
    BasicFlags,
):
    """All flags of ``msf-train``, read flat (``cfg.batch_size``). Names, meanings and defaults follow
    Sample Factory 2; each is documented in :mod:`msf.cfg.flags` and in ``msf-train --help``.

    ``env_args``: the values of flags that a launch script added to the parser (Sample Factory's
    ``add_extra_params_func``, see :mod:`msf.sf2`), read as attributes too (``cfg.custom_env_episode_len``), so
    that an env maker written for Sample Factory finds them; saved in ``config.json`` and taken from each launch.
    """

    env_args: dict = dataclasses.field(
        default_factory=dict,
        metadata={
            "help": "",
            "group": None,
            "choices": None,
            "item_type": str,
            "scope": frozenset(),
            "cli": False,
        },
    )

    def __getattr__(self, name: str):
        # only for names that are not fields: a launch script's own flags (env_args)
        extra = self.__dict__.get("env_args")
        if extra is not None and name in extra:
            return extra[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        """A config from a saved ``config.json``; keys that are not flags are left out. A flag that shapes the
        model but that the file predates gets the value msf used before the flag existed (:data:`BEFORE_FLAG`),
        so that an older experiment's checkpoints still fit its config.

        Raises:
            TypeError: a value is not of its flag's type (a file edited by hand), such as ``"batch_size": "abc"``.
        """
        defaults = cls().to_dict()
        values = {k: v for k, v in d.items() if k in defaults}
        for k, v in values.items():
            kind = (int, float) if isinstance(defaults[k], float) else type(defaults[k])
            if defaults[k] is not None and not isinstance(v, kind):
                raise TypeError(f"{k}: {v!r} is not of the flag's type ({type(defaults[k]).__name__})")
        for name, value in BEFORE_FLAG.items():
            if name not in d and name in defaults:
                values[name] = value
        return cls(**values)


ENV_ARG = "env_args:"
"""``given`` holds ``env_args:NAME`` for each of a launch script's own flags given on its command line."""


def merge_env_args(saved: dict, current: dict, given: set[str]) -> tuple[dict, list[str]]:
    """A resumed or evaluated experiment's script flags (``Config.env_args``): the saved values, with those given
    on this command line (``env_args:NAME`` in ``given``) on top, and flags the saved config lacks from
    ``current`` (Sample Factory's ``load_from_checkpoint`` rule). Returns the values and the changes
    (``"--name: old -> new"``)."""
    merged, changes = dict(saved), []
    for k, v in current.items():
        if k not in saved:
            merged[k] = v
        elif ENV_ARG + k in given and saved[k] != v:
            changes.append(f"--{k}: {saved[k]!r} -> {v!r}")
            merged[k] = v
    return merged, changes


# What msf did before these flags existed (all of them shape the model or its input)
BEFORE_FLAG: dict[str, object] = {
    "adaptive_stddev": False,  # a state-independent log-std
    "obs_scale": None,
    "obs_subtract_mean": 0.0,
    "decoder_mlp_layers": [],
}


def flags_in_scope(scope: str) -> frozenset[str]:
    """The names of the flags whose ``metadata["scope"]`` holds ``scope`` (see :mod:`msf.cfg.flags`)."""
    return frozenset(f.name for f in dataclasses.fields(Config) if scope in f.metadata["scope"])


LAUNCH_FLAGS = flags_in_scope(LAUNCH)
"""Taken from each launch's command line, never from a resumed experiment's saved config."""
FIXED_FLAGS = flags_in_scope(FIXED)
"""What the checkpoint's shapes depend on: they cannot change for an existing experiment."""
PER_NODE_FLAGS = flags_in_scope(PER_NODE)
"""They may differ between the nodes of one job; all other flags must be the same on every node."""
FAMILY_ONLY_FLAGS = {
    "atari_screen_size": "atari_",
    "atari_full_action_space": "atari_",
    "res_w": "doom_",
    "res_h": "doom_",
}
"""Fixed flags that only one env family reads (name -> the env name's prefix): for an env of another family they
shape nothing, so a resumed experiment of that env may change them (with the usual warning)."""


def fixed_for(name: str, env: str) -> bool:
    """Whether flag ``name`` may not change for an existing experiment of ``env`` (:data:`FIXED_FLAGS`, less
    :data:`FAMILY_ONLY_FLAGS` of another family)."""
    return name in FIXED_FLAGS and env.startswith(FAMILY_ONLY_FLAGS.get(name, ""))


def core_state_size(cfg: Config) -> int:
    """Floats of state of one recurrent core per agent: GRU ``L x H``, LSTM ``2 x L x H`` (h of every layer, then
    c); 0 without ``use_rnn``."""
    if not cfg.use_rnn:
        return 0
    return cfg.rnn_num_layers * cfg.rnn_size * (2 if cfg.rnn_type == "lstm" else 1)


def rnn_state_size(cfg: Config) -> int:
    """Floats of recurrent state per agent, the one place that says it: what the trajectory buffer's
    ``rnn_states`` ``[S, T + 1, rnn_state_size]``, the inference workers, the learner's sequences, msf-enjoy and
    an exported policy carry. One core's state (:func:`core_state_size`) with ``actor_critic_share_weights``;
    without, the actor's core's then the critic's, side by side (Sample Factory's order), twice as many."""
    return core_state_size(cfg) * (1 if cfg.actor_critic_share_weights else 2)


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
            ``num_batches_to_accumulate`` iterations of finished trajectories (at least one per agent; none
            with 0, where an agent whose trajectory is finished waits until the learner has copied it out, but
            one per agent with ``--serial_mode``, whose one process cannot wait inside a step);
            with ``--async_rl=False``, exactly ``sync_rollouts`` finished ones per agent.
        remote_slots: trajectory-buffer slots, after the rollout workers', where trajectories from sampler nodes
            are written (``--sampler_port``): two iterations' worth, so that one can arrive while the learner
            takes the other; 0 without sampler nodes.
        sync_rollouts: with ``--async_rl=False``, the trajectories every agent of every env writes per training
            iteration (``trajectories_per_iteration / (num_workers x num_envs_per_worker x num_agents)``, a
            whole number: :func:`msf.cfg.validation.check_sync`); 0 with ``--async_rl=True``.
        frameskip: frames per env step used for counting (1 without summaries_use_frameskip).
        num_agents: agents per env (1, or a multi-agent env's ``num_agents``).
        rnn_state_size: floats of recurrent state per agent (:func:`rnn_state_size`).
    """

    recurrence: int
    envs_per_split: int
    trajectories_per_batch: int
    trajectories_per_iteration: int
    slots_per_worker: int
    frameskip: int
    rnn_state_size: int = 0
    num_agents: int = 1
    sync_rollouts: int = 0
    remote_slots: int = 0

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
        # 0: no spares; an env whose trajectory is finished waits until the learner has copied it out. Not in
        # --serial_mode: its one process cannot wait inside a step for the learner, so it keeps one spare per agent
        accumulate = cfg.num_batches_to_accumulate or int(cfg.serial_mode)
        workers = max(cfg.num_workers, 1)  # 0: a learner fed by sampler nodes only (no slot is a worker's)
        spare = max(agents_per_worker, -(-accumulate * per_iter // workers)) if accumulate else 0
        sync = 0 if cfg.async_rl else max(1, per_iter // (workers * agents_per_worker))
        if sync:  # the finished trajectories of one iteration, held until the learner has trained on them
            spare = sync * agents_per_worker
        return cls(
            recurrence=recurrence,
            envs_per_split=cfg.num_envs_per_worker // cfg.worker_num_splits,
            trajectories_per_batch=per_batch,
            trajectories_per_iteration=per_iter,
            slots_per_worker=agents_per_worker + spare,
            frameskip=cfg.env_frameskip if cfg.summaries_use_frameskip else 1,
            rnn_state_size=rnn_state_size(cfg),
            num_agents=num_agents,
            sync_rollouts=sync,
            remote_slots=2 * per_iter if cfg.sampler_port else 0,
        )
