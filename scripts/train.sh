#!/usr/bin/env bash
# Trains APPO on CartPole-v1 (the default environment); extra flags are passed to msf-train.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
exec "${MSF_VENV:-$ROOT/.venv}/bin/msf-train" --env=CartPole-v1 --experiment=cartpole "$@"
