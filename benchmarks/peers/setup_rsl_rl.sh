#!/usr/bin/env bash
# The venv that benchmarks/peers/rsl_rl_cartpole.py runs in: rsl_rl beside a CPU torch, apart from msf's own venv.
# Usage: bash benchmarks/peers/setup_rsl_rl.sh [VENV_DIR]   (default benchmarks/peers/.venv-rsl, git-ignored)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${1:-$HERE/.venv-rsl}
python3.11 -m venv "$VENV"
PIP="$VENV/bin/pip"
# torch first and pinned to the release whose CPU wheel lies on local disk (/opt/wheels): any other version
# resolves to a CUDA build of several GB.
"$PIP" install torch==2.13.0
# rsl-rl-lib 5.5.1 asks for torch>=2.6 (satisfied: not upgraded), tensordict, numpy, onnx*, GitPython and
# tensorboard. torch==2.13.0 is repeated so that the resolver can never replace it. gymnasium: msf's torch
# CartPole (imported from msf's src through PYTHONPATH) declares its spaces with it; msf's own version.
"$PIP" install torch==2.13.0 rsl-rl-lib==5.5.1 gymnasium==1.4.0
"$VENV/bin/python" -c "import torch, rsl_rl; assert torch.__version__ == '2.13.0+cpu', torch.__version__"
echo "venv ready: $VENV"
