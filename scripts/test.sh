#!/usr/bin/env bash
# Runs the test suite (the default excludes tests marked slow; pass -m slow for those).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec "${MSF_VENV:-$ROOT/.venv}/bin/python" -m pytest "$@"
