"""Train the torch CartPole, a device-side vector env, to gymnasium's threshold (docs/device_envs.md).

    python examples/device_env_cartpole.py [--nproc_per_node=2] [--device=gpu] [more msf-train flags]

The env (``msf.envs.torch_cartpole.TorchCartPole``) steps 1,024 CartPoles in one call on the device group's device;
each device group steps its own in its own process, acts with its learner's model on the same device and trains on
the trajectories where they were written. To train your own torch env instead, register it at import of a module
(``msf.envs.register_device_env("my_sim", factory, observation_space, action_space)``) and pass
``--env=my_module:my_sim``.
"""

from __future__ import annotations

import sys

from msf.train import main as msf_train

FLAGS = [
    "--env=torch_cartpole",
    "--env_gpu_actions=True",
    "--env_gpu_observations=True",
    "--experiment=torch_cartpole",
    "--num_envs_per_worker=1024",
    "--rollout=16",
    "--batch_size=4096",
    "--num_batches_per_epoch=4",
    "--num_epochs=4",
    "--learning_rate=1e-3",
    "--encoder_mlp_layers",
    "64",
    "64",
    "--value_bootstrap=True",
    "--reward_scale=0.1",
    "--num_batches_to_accumulate=0",
    "--stop_at_return_mean=475",
    "--train_for_env_steps=3000000",
]

if __name__ == "__main__":
    sys.exit(msf_train([*FLAGS, *sys.argv[1:]]))
