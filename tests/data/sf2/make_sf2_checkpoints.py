"""Make the Sample Factory 2.1.1 reference experiments of ``tests/unit/test_sf2_checkpoint.py``.

The record of how ``tests/data/sf2/<model>/`` was made; the tests only read its output. Run it with a Python that
has Sample Factory 2.1.1 (and gymnasium 0.29, ale-py for the Atari defaults)::

    /tmp/anchors-venv/bin/python tests/data/sf2/make_sf2_checkpoints.py

For each model it parses Sample Factory's own command line (``parse_sf_args`` + ``parse_full_cfg``, and for the
Atari model the defaults of ``sf_examples.atari``), builds Sample Factory's actor-critic with
``create_actor_critic(cfg, obs_space, action_space)`` under a fixed seed, perturbs every parameter (biases are
zero after Sample Factory's initialisation, so a wrongly mapped bias would go unseen), takes one Adam step on a
dummy loss for the small models (so that the optimiser state is not empty), sets the normalisers' running
statistics to random values (so that they matter), and writes what Sample Factory's learner writes:

* ``<model>/config.json``: ``vars(cfg)`` as ``json.dump(..., indent=2)`` (the runner's ``_save_cfg``);
* ``<model>/checkpoint_p0/checkpoint_000000010_1280.pth``: the learner's ``_get_checkpoint_dict()`` keys
  (``train_step``, ``env_steps``, ``best_performance``, ``model``, ``optimizer``, ``curr_lr``) by ``torch.save``;
  the CartPole model also has a ``best_000000010_1280_reward_123.000.pth``;
* ``<model>/reference.npz``: ``obs`` ``[N, *obs_shape]``, the ``rnn_states`` ``[N, S]`` given to the model
  (Sample Factory's layout), and its outputs in eval mode: ``action_logits`` ``[N, P]`` (for the Gaussian head
  means then log standard deviations), ``values`` ``[N]``, ``new_rnn_states`` ``[N, S]``; for the recurrent
  models with separate actor and critic weights also a run of ``K = 5`` steps from those states, each step's
  state the last one's new state zeroed where an episode ended (as Sample Factory's rollout workers do):
  ``seq_obs`` ``[K, N, *obs_shape]``, ``seq_dones`` ``[K, N]`` (the episode ended after that step),
  ``seq_action_logits`` ``[K, N, P]``, ``seq_values`` ``[K, N]``, ``seq_new_rnn_states`` ``[K, N, S]``.

To keep the shipped data small (about 2 MB), the conv models have a 16-unit fully connected layer after the conv
stack (``encoder_conv_mlp_layers=[16]``, Sample Factory's default is 512: the key layout is the same); the
convnet_atari model has the real Atari observation ``[4, 84, 84]``, convnet_simple and resnet_impala smaller
images (``[3, 36, 36]``, ``[3, 16, 16]``) with the same conv stacks.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import gymnasium as gym
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 20240611
N_OBS = 20
K_STEPS = 5


def pixels(rng: np.random.Generator, n: int, shape: tuple[int, ...], block: int) -> np.ndarray:
    """``[n, *shape]`` uint8 images of random ``block x block`` squares (they compress well in the npz)."""
    c, h, w = shape
    small = rng.integers(0, 256, size=(n, c, -(-h // block), -(-w // block)), dtype=np.uint8)
    big = small.repeat(block, axis=2).repeat(block, axis=3)
    return np.ascontiguousarray(big[:, :, :h, :w])


CARTPOLE_OBS = gym.make("CartPole-v1").observation_space
MODELS = {
    # name: (command line, observation space, action space, one Adam step)
    "mlp": (
        ["--env=CartPole-v1", "--encoder_mlp_layers", "16", "16", "--use_rnn=False"],
        CARTPOLE_OBS,
        gym.spaces.Discrete(2),
        True,
    ),
    "mlp_gru": (
        ["--env=CartPole-v1", "--encoder_mlp_layers", "16", "--use_rnn=True", "--rnn_type=gru", "--rnn_size=8"],
        CARTPOLE_OBS,
        gym.spaces.Discrete(2),
        True,
    ),
    "mlp_lstm2": (
        [
            "--env=CartPole-v1",
            "--encoder_mlp_layers",
            "16",
            "--use_rnn=True",
            "--rnn_type=lstm",
            "--rnn_size=8",
            "--rnn_num_layers=2",
            "--nonlinearity=tanh",
        ],
        CARTPOLE_OBS,
        gym.spaces.Discrete(2),
        True,
    ),
    "mlp_separate": (
        [
            "--env=CartPole-v1",
            "--encoder_mlp_layers",
            "16",
            "8",
            "--use_rnn=False",
            "--actor_critic_share_weights=False",
        ],
        CARTPOLE_OBS,
        gym.spaces.Discrete(2),
        True,
    ),
    # separate weights: an encoder, a decoder (and a core) each for actor and critic (ActorCriticSeparateWeights)
    "mlp_separate_decoder": (
        [
            "--env=CartPole-v1",
            "--encoder_mlp_layers",
            "16",
            "--decoder_mlp_layers",
            "8",
            "--use_rnn=False",
            "--actor_critic_share_weights=False",
        ],
        CARTPOLE_OBS,
        gym.spaces.Discrete(2),
        True,
    ),
    "mlp_separate_lstm2": (
        [
            "--env=CartPole-v1",
            "--encoder_mlp_layers",
            "16",
            "--use_rnn=True",
            "--rnn_type=lstm",
            "--rnn_size=8",
            "--rnn_num_layers=2",
            "--decoder_mlp_layers",
            "8",
            "--actor_critic_share_weights=False",
        ],
        CARTPOLE_OBS,
        gym.spaces.Discrete(2),
        True,
    ),
    "mlp_continuous": (
        [
            "--env=sf2_synthetic_continuous",
            "--encoder_mlp_layers",
            "16",
            "--use_rnn=False",
            "--adaptive_stddev=False",
            "--initial_stddev=0.5",
            "--nonlinearity=tanh",
        ],
        gym.spaces.Box(-10.0, 10.0, (5,), np.float32),
        gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        True,
    ),
    "convnet_atari": (
        ["--env=atari_pong", "--encoder_conv_mlp_layers", "16", "--normalize_input=False"],
        gym.spaces.Box(0, 255, (4, 84, 84), np.uint8),
        gym.spaces.Discrete(6),
        False,
    ),
    "convnet_simple": (
        [
            "--env=sf2_synthetic_pixels",
            "--encoder_conv_architecture=convnet_simple",
            "--encoder_conv_mlp_layers",
            "16",
            "--obs_scale=255",
            "--use_rnn=False",
        ],
        gym.spaces.Box(0, 255, (3, 36, 36), np.uint8),
        gym.spaces.Discrete(6),
        False,
    ),
    "convnet_impala": (
        [
            "--env=sf2_synthetic_pixels",
            "--encoder_conv_architecture=convnet_impala",
            "--encoder_conv_mlp_layers",
            "16",
            "--obs_scale=255",
            "--use_rnn=False",
        ],
        gym.spaces.Box(0, 255, (3, 36, 36), np.uint8),
        gym.spaces.Discrete(6),
        False,
    ),
    "resnet_impala": (
        [
            "--env=sf2_synthetic_pixels",
            "--encoder_conv_architecture=resnet_impala",
            "--encoder_conv_mlp_layers",
            "16",
            "--obs_scale=255",
            "--use_rnn=False",
        ],
        gym.spaces.Box(0, 255, (3, 16, 16), np.uint8),
        gym.spaces.Discrete(6),
        False,
    ),
}


def sf_config(name: str, argv: list[str]):
    """Sample Factory's own parsing of ``argv`` (with the Atari family's defaults for ``atari_*``)."""
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args

    argv = argv + [f"--experiment={name}", "--train_dir=/home/someone/train_dir", "--device=cpu", f"--seed={SEED}"]
    parser, _ = parse_sf_args(argv)
    if any(a.startswith("--env=atari_") for a in argv):
        from sf_examples.atari.atari_params import atari_override_defaults

        atari_override_defaults(None, parser)
    return parse_full_cfg(parser, argv)


def observations(rng: np.random.Generator, space: gym.spaces.Box) -> np.ndarray:
    if space.dtype == np.uint8:
        return pixels(rng, N_OBS, space.shape, block=7 if space.shape[1] >= 84 else 2)
    obs = rng.normal(0.0, 1.5, size=(N_OBS, *space.shape)).astype(np.float32)
    obs[0] = 50.0  # far beyond the normaliser's clip
    obs[1] = -50.0
    return obs


def steps(model, rng: np.random.Generator, obs_space: gym.spaces.Box, rnn_states: torch.Tensor) -> dict:
    """``K_STEPS`` steps of the model in eval mode from ``rnn_states``, with episode ends (the ``seq_*`` arrays)."""
    obs = np.stack([observations(rng, obs_space) for _ in range(K_STEPS)])
    dones = (rng.random((K_STEPS, N_OBS)) < 0.3).astype(np.float32)
    dones[-1] = 0.0
    logits, values, new_states = [], [], []
    with torch.no_grad():
        for t in range(K_STEPS):
            out = model(model.normalize_obs({"obs": torch.as_tensor(obs[t])}), rnn_states)
            logits.append(out["action_logits"].numpy())
            values.append(out["values"].numpy())
            new_states.append(out["new_rnn_states"].numpy())
            rnn_states = out["new_rnn_states"] * (1.0 - torch.as_tensor(dones[t])).unsqueeze(-1)
    return dict(
        seq_obs=obs,
        seq_dones=dones,
        seq_action_logits=np.stack(logits),
        seq_values=np.stack(values),
        seq_new_rnn_states=np.stack(new_states),
    )


def make(name: str) -> None:
    from sample_factory.model.actor_critic import create_actor_critic
    from sample_factory.model.model_utils import get_rnn_size

    argv, obs_space, action_space, step = MODELS[name]
    cfg = sf_config(name, argv)
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED + len(name))
    model = create_actor_critic(cfg, gym.spaces.Dict({"obs": obs_space}), action_space)
    params = [p for _, p in model.named_parameters()]
    buffers = {n for n, _ in model.named_buffers()}
    # the optimiser's indices are the positions in model.parameters(), the parameters' order in the state dict
    assert [n for n, _ in model.named_parameters()] == [k for k in model.state_dict() if k not in buffers]
    optimizer = torch.optim.Adam(params, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps)
    with torch.no_grad():
        for p in params:  # weights by a tenth of their spread (a deep net's gain stays near 1), biases by 0.05
            p.add_(torch.randn_like(p) * (0.1 * float(p.std()) if p.dim() > 1 else 0.05))
    obs = observations(rng, obs_space)
    rnn_size = get_rnn_size(cfg)
    if step:
        model.train()
        dummy = {"obs": torch.as_tensor(obs[:4]).float()}
        out = model(dummy, torch.zeros(4, rnn_size))
        (out["action_logits"].square().mean() + out["values"].square().mean()).backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        for n, b in model.named_buffers():
            if n.endswith("running_mean"):
                b.copy_(
                    torch.as_tensor(
                        rng.uniform(0.3, 0.7, size=b.shape)
                        if obs_space.dtype == np.uint8
                        else rng.normal(0, 0.5, size=b.shape)
                    )
                )
            elif n.endswith("running_var"):
                b.copy_(
                    torch.as_tensor(
                        rng.uniform(0.05, 0.25, size=b.shape)
                        if obs_space.dtype == np.uint8
                        else rng.uniform(0.3, 3.0, size=b.shape)
                    )
                )
            elif n.endswith("count"):
                b.fill_(12345.0)
    model.eval()  # Sample Factory's normalisers update their statistics in forward() in training mode
    rnn_states = (
        torch.as_tensor(rng.normal(0, 0.5, size=(N_OBS, rnn_size)), dtype=torch.float32)
        if cfg.use_rnn
        else torch.zeros(N_OBS, rnn_size)
    )
    with torch.no_grad():
        normalized = model.normalize_obs({"obs": torch.as_tensor(obs)})
        out = model(normalized, rnn_states)

    sequence = {}
    if cfg.use_rnn and not cfg.actor_critic_share_weights:
        sequence = steps(model, rng, obs_space, rnn_states)

    exp = os.path.join(HERE, name)
    shutil.rmtree(exp, ignore_errors=True)
    os.makedirs(os.path.join(exp, "checkpoint_p0"))
    with open(os.path.join(exp, "config.json"), "w") as f:
        json.dump(vars(cfg), f, indent=2)
    checkpoint = {
        "train_step": 10,
        "env_steps": 1280,
        "best_performance": 123.0 if name == "mlp" else -1e9,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "curr_lr": cfg.learning_rate,
    }
    torch.save(checkpoint, os.path.join(exp, "checkpoint_p0", "checkpoint_000000010_1280.pth"))
    if name == "mlp":
        torch.save(checkpoint, os.path.join(exp, "checkpoint_p0", "best_000000010_1280_reward_123.000.pth"))
    np.savez_compressed(
        os.path.join(exp, "reference.npz"),
        obs=obs,
        rnn_states=rnn_states.numpy(),
        action_logits=out["action_logits"].numpy(),
        values=out["values"].numpy(),
        new_rnn_states=out["new_rnn_states"].numpy(),
        **sequence,
    )
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(exp) for f in fs)
    print(f"{name}: {sum(p.numel() for p in params)} parameters, {size / 1024:.0f} KiB")


def main() -> None:
    os.chdir(tempfile.mkdtemp())  # Sample Factory records the git state of the working directory: none here
    names = sys.argv[1:] or list(MODELS)
    for name in names:
        make(name)


if __name__ == "__main__":
    main()
