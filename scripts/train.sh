#!/usr/bin/env bash
# Trains APPO on CartPole-v1 (the default environment) for 300,000 env steps with the settings the
# README recommends for small environments; extra flags are passed on to msf-train and win.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
exec "${MSF_VENV:-$ROOT/.venv}/bin/msf-train" --env=CartPole-v1 --experiment=cartpole --train_for_env_steps=300000 \
  --num_workers=2 --num_envs_per_worker=16 --worker_num_splits=2 --batch_size=512 --rollout=32 \
  --learning_rate=3e-4 --lr_schedule=kl_adaptive_epoch --lr_adaptive_max=2e-3 --value_bootstrap=True \
  --reward_scale=0.1 "$@"
