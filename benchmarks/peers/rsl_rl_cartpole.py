"""rsl_rl's PPO (``rsl-rl-lib``, its ``OnPolicyRunner``) on msf's torch CartPole, until a mean return of 475.

Runs in the venv of ``benchmarks/peers/setup_rsl_rl.sh`` (rsl_rl is no dependency of msf), with msf's ``src`` on
``PYTHONPATH`` for the env class only:

    PYTHONPATH=src benchmarks/peers/.venv-rsl/bin/python benchmarks/peers/rsl_rl_cartpole.py --envs 1024

The env is ``msf.envs.torch_cartpole.TorchCartPole`` (gymnasium's CartPole-v1 batched in torch, same-step autoreset),
wrapped here in rsl_rl's ``VecEnv`` interface: observations as a TensorDict ``{"policy": [N, 4]}``, dones =
terminated or truncated, ``extras["time_outs"]`` = truncated and not terminated (rsl_rl then adds gamma x V to the
last reward, as msf's ``--value_bootstrap=True``), rewards multiplied by ``--reward_scale`` (msf's
``--reward_scale=0.1``).

rsl_rl ships Gaussian and Beta action distributions only; CartPole's actions are discrete, so a categorical
distribution is plugged into rsl_rl's ``distribution_cfg`` (its model's extension point): the MLP's 2 outputs are
logits, an action is the index of the sampled category (actions ``[N, 1]``).

The settings are msf's of ``benchmarks/device_cartpole.py`` (``docs/device_envs.md``) in rsl_rl's names: 16 steps
per env and iteration, 4 minibatches (4,096 samples each with 1,024 envs), 4 epochs, a fixed learning rate of 1e-3,
gamma 0.99, lambda 0.95, clip 0.1, value loss coefficient 0.5, entropy coefficient 0.003, gradient norm 4.0,
observations normalised, advantages normalised per minibatch, ELU 64-64 MLPs. Where the two differ by design:
rsl_rl has separate actor and critic MLPs (msf shares one encoder), no value-target normalisation (msf's
``--normalize_returns``); the value loss is not clipped here (rsl_rl would clip the value change at its policy clip,
0.1, in unnormalised units; msf clips it at 1.0 in normalised ones). The runner logs to TensorBoard in a temporary
folder, as msf's run does (rsl_rl counts episode returns only with a log folder); its console lines are dropped.

Measures, after each iteration, rsl_rl's own mean return of the last 100 finished episodes (its logger's buffer,
divided by the reward scale) and stops when it reaches ``--target`` or after ``--max_steps`` env steps. Prints one
JSON line: ``env_steps``, ``train_s`` (seconds of ``runner.learn``), ``steps_per_s`` (env steps / train_s),
``env_s`` (seconds inside the env's ``step``), ``update_s`` (seconds of the PPO update: epochs x minibatches),
``startup_s`` (from the start of this script to the first iteration: imports, env and runner),
``reached_at_steps`` (None: not reached), ``return_mean``, ``iterations``, ``versions``.
"""

from __future__ import annotations

import time

T0 = time.monotonic()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from importlib.metadata import version  # noqa: E402

import torch  # noqa: E402
from rsl_rl.env import VecEnv  # noqa: E402
from rsl_rl.modules.distribution import Distribution  # noqa: E402
from rsl_rl.runners import OnPolicyRunner  # noqa: E402
from tensordict import TensorDict  # noqa: E402

from msf.envs.torch_cartpole import MAX_EPISODE_STEPS, TorchCartPole  # noqa: E402


class CategoricalDistribution(Distribution):
    """Categorical actions for rsl_rl's ``MLPModel``: the MLP's ``num_categories`` outputs are logits; a sample is
    the category's index as a float ``[N, 1]`` (rsl_rl's storage holds actions as float vectors)."""

    def __init__(self, output_dim: int, num_categories: int = 2) -> None:
        super().__init__(output_dim)
        self.num_categories = num_categories
        self._dist: torch.distributions.Categorical | None = None

    def update(self, mlp_output: torch.Tensor) -> None:
        self._dist = torch.distributions.Categorical(logits=mlp_output, validate_args=False)

    def sample(self) -> torch.Tensor:
        return self._dist.sample().unsqueeze(-1).float()

    def deterministic_output(self, mlp_output: torch.Tensor) -> torch.Tensor:
        return mlp_output.argmax(-1, keepdim=True).float()

    @property
    def input_dim(self) -> int:
        return self.num_categories

    @property
    def mean(self) -> torch.Tensor:
        return self._dist.probs

    @property
    def std(self) -> torch.Tensor:
        return self._dist.probs.mul(1 - self._dist.probs).sqrt()

    @property
    def entropy(self) -> torch.Tensor:
        return self._dist.entropy()

    @property
    def params(self) -> tuple[torch.Tensor, ...]:
        return (self._dist.logits,)

    def log_prob(self, outputs: torch.Tensor) -> torch.Tensor:
        return self._dist.log_prob(outputs.squeeze(-1).long())

    def kl_divergence(self, old_params: tuple[torch.Tensor, ...], new_params: tuple[torch.Tensor, ...]) -> torch.Tensor:
        old, new = old_params[0].log_softmax(-1), new_params[0].log_softmax(-1)
        return (old.exp() * (old - new)).sum(-1)


class CartPoleVecEnv(VecEnv):
    """msf's :class:`TorchCartPole` behind rsl_rl's ``VecEnv``: ``step(actions [N, 1])`` returns
    ``({"policy": obs [N, 4]}, rewards [N] x reward_scale, dones [N] float, {"time_outs": [N] float})``."""

    def __init__(self, num_envs: int, seed: int, reward_scale: float):
        self.env = TorchCartPole(num_envs, "cpu", seed)
        self.num_envs, self.num_actions, self.device, self.cfg = num_envs, 1, torch.device("cpu"), {}
        self.max_episode_length = MAX_EPISODE_STEPS
        self.episode_length_buf = self.env.elapsed
        self.reward_scale = reward_scale
        self.obs, self.env_s = self.env.reset(), 0.0

    def get_observations(self) -> TensorDict:
        return TensorDict({"policy": self.obs}, batch_size=[self.num_envs])

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
        t = time.monotonic()
        self.obs, reward, terminated, truncated = self.env.step(actions[:, 0].long())
        self.env_s += time.monotonic() - t
        dones = (terminated | truncated).float()
        extras = {"time_outs": (truncated & ~terminated).float()}
        return self.get_observations(), reward * self.reward_scale, dones, extras


def train_cfg(a: argparse.Namespace) -> dict:
    """rsl_rl's runner configuration with msf's device_cartpole settings (see the module's docstring)."""
    model = {"class_name": "MLPModel", "hidden_dims": [64, 64], "activation": "elu", "obs_normalization": True}
    return {
        "num_steps_per_env": a.rollout,
        "save_interval": 10**9,
        "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "actor": {**model, "distribution_cfg": {"class_name": CategoricalDistribution, "num_categories": 2}},
        "critic": model,
        "algorithm": {
            "class_name": "PPO",
            "num_learning_epochs": 4,
            "num_mini_batches": 4,
            "clip_param": 0.1,
            "gamma": 0.99,
            "lam": 0.95,
            "value_loss_coef": 0.5,
            "entropy_coef": 0.003,
            "learning_rate": 1e-3,
            "max_grad_norm": 4.0,
            "use_clipped_value_loss": False,
            "schedule": "fixed",
            "normalize_advantage_per_mini_batch": True,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=1024)
    parser.add_argument("--rollout", type=int, default=16)
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--max_steps", type=int, default=3_000_000)
    parser.add_argument("--reward_scale", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (msf's --learner_threads)")
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    env = CartPoleVecEnv(a.envs, a.seed, a.reward_scale)
    with tempfile.TemporaryDirectory() as log_dir, open(os.devnull, "w") as quiet:
        out, sys.stdout = sys.stdout, quiet  # the runner prints its models and a block per iteration
        try:
            runner = OnPolicyRunner(env, train_cfg(a), log_dir=log_dir, device="cpu")
            result = train(runner, env, a)
        finally:
            sys.stdout = out
    result["startup_s"] = result.pop("first_iteration_at") - T0
    result["versions"] = {p: version(p) for p in ("rsl-rl-lib", "torch")}
    print(json.dumps(result))


class _Reached(Exception):
    """Raised from the logger's per-iteration call to end ``runner.learn`` at the target."""


def train(runner: OnPolicyRunner, env: CartPoleVecEnv, a: argparse.Namespace) -> dict:
    """``runner.learn`` for up to ``--max_steps``, as a user calls it, ended at the first iteration whose mean return
    of the last 100 episodes (rsl_rl's logger's buffer, filled only with a log dir) reaches ``--target``. The PPO
    update's seconds are timed around ``runner.alg.update``, the env's in the wrapper."""
    per_iteration = a.envs * a.rollout
    books = {"iterations": 0, "update_s": 0.0, "return_mean": None}
    log, update = runner.logger.log, runner.alg.update

    def timed_update() -> dict:
        t = time.monotonic()
        losses = update()
        books["update_s"] += time.monotonic() - t
        return losses

    def log_and_check(**kwargs) -> None:
        log(**kwargs)
        books["iterations"] += 1
        buf = runner.logger.rewbuffer
        books["return_mean"] = sum(buf) / len(buf) / a.reward_scale if buf else None
        if books["return_mean"] is not None and books["return_mean"] >= a.target:
            raise _Reached

    runner.alg.update, runner.logger.log = timed_update, log_and_check
    first, reached = time.monotonic(), False
    try:
        runner.learn(-(-a.max_steps // per_iteration))
    except _Reached:
        reached = True
    train_s = time.monotonic() - first
    steps = books["iterations"] * per_iteration
    return {
        "system": "rsl_rl",
        "envs": a.envs,
        "env_steps": steps,
        "train_s": train_s,
        "steps_per_s": steps / train_s,
        "env_s": env.env_s,
        "update_s": books["update_s"],
        "first_iteration_at": first,
        "reached_at_steps": steps if reached else None,
        "return_mean": books["return_mean"],
        "iterations": books["iterations"],
    }


if __name__ == "__main__":
    main()
