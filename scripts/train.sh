#!/usr/bin/env bash
# Trains APPO on CartPole-v1 (the default environment) for 300,000 env steps with the settings for
# small environments (msf/cfg/presets.py, docs/training.md); extra flags go to msf-train and win.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${MSF_VENV:-$ROOT/.venv}
bash "$ROOT/scripts/setup.sh"
read -r -a SMALL_ENV <<< "$("$VENV/bin/python" -c 'from msf.cfg.presets import SMALL_ENV_FLAGS as f; print(" ".join(f))')"
exec "$VENV/bin/msf-train" --env=CartPole-v1 --experiment=cartpole --train_for_env_steps=300000 "${SMALL_ENV[@]}" "$@"
