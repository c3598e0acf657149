"""Dict observations (split again per key), multi-discrete actions, action masks."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from msf.cfg.config import Config
from msf.envs.registry import flatten_dict_obs, spaces_of
from msf.model.actor_critic import ActorCritic
from msf.model.distributions import MultiCategorical


def test_multi_categorical_is_the_product_of_its_dimensions():
    torch.manual_seed(0)
    logits = torch.randn(5, 7, dtype=torch.float64)
    actions = torch.stack([torch.randint(0, 3, (5,)), torch.randint(0, 4, (5,))], 1)
    d = MultiCategorical(logits, (3, 4))
    p1, p2 = torch.softmax(logits[:, :3], -1), torch.softmax(logits[:, 3:], -1)
    expected = torch.log(p1.gather(1, actions[:, :1]).squeeze(1) * p2.gather(1, actions[:, 1:]).squeeze(1))
    torch.testing.assert_close(d.log_prob(actions), expected)
    entropy = -(p1 * p1.log()).sum(-1) - (p2 * p2.log()).sum(-1)
    torch.testing.assert_close(d.entropy(), entropy)
    assert torch.equal(d.mode, torch.stack([p1.argmax(-1), p2.argmax(-1)], 1))
    assert d.sample().shape == (5, 2)


class _DictEnv(gym.Env):
    def __init__(self):
        self.observation_space = gym.spaces.Dict(
            {
                "pos": gym.spaces.Box(-1, 1, (2,), np.float32),
                "action_mask": gym.spaces.MultiBinary(4),
                "room": gym.spaces.Discrete(3),
            }
        )
        self.action_space = gym.spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        return {"pos": np.array([0.5, -0.5], np.float32), "action_mask": np.array([1, 0, 1, 0], np.int8), "room": 2}, {}


def test_dict_observations_are_flattened_and_split_again_with_the_mask_applied():
    env = flatten_dict_obs(_DictEnv())
    spaces = spaces_of(env)
    # gymnasium orders a Dict's keys; Discrete keys become one-hot
    assert spaces.obs_layout == (("action_mask", (4,), 4), ("pos", (2,), 2), ("room", (3,), 3))
    assert spaces.obs_shape == (9,)
    obs, _ = env.reset()
    np.testing.assert_array_equal(obs, [1, 0, 1, 0, 0.5, -0.5, 0, 0, 1])
    torch.manual_seed(0)
    model = ActorCritic(Config(encoder_mlp_layers=[16]), spaces)
    assert set(model.actor_encoder.encoders) == {"pos", "room"}  # the mask is not encoded
    x = torch.as_tensor(obs, dtype=torch.float32)[None].repeat(2000, 1)
    actions, _, _, _ = model.act(x)
    assert set(actions.tolist()) == {0, 2}  # the masked actions 1 and 3 are never drawn
    # each vector key has its own normaliser, fed with its own part of the flat vector
    model.update_obs_statistics(x)
    torch.testing.assert_close(model.actor_encoder.normalizers["pos"].mean.float(), torch.tensor([0.5, -0.5]))
