#!/usr/bin/env bash
# Creates ./.venv on first use and installs msf into it (editable, with test tools and every optional extra).
# torch 2.13.0 (the CPU wheel) is installed only when no torch is importable, so an
# existing CUDA build is kept. Re-runs are cheap: pip runs again only when pyproject.toml changes.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${MSF_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.msf-installed"
WANT=$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "[setup] installing torch==2.13.0" >&2
    "$VENV/bin/pip" install -q torch==2.13.0
  fi
  echo "[setup] installing msf and its dependencies" >&2
  "$VENV/bin/pip" install -q -e "$ROOT[dev,all]"
  echo "$WANT" > "$STAMP"
fi
