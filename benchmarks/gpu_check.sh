#!/usr/bin/env bash
# The checks that need a GPU, as one script for a machine lent for a few minutes (one CUDA GPU, many
# cores, no network). Run from the repository root; logs go to $OUT (default ./gpu_check_out).
#
#   1. pytest tests/gpu: learner on cuda vs CPU, two DDP replicas on one GPU, msf-train --device=gpu
#      solving CartPole and resuming on the CPU.
#   2. atari_pong with --device=gpu on all cores (Sample Factory's Atari arguments, more workers and a
#      larger batch), towards 10M frames until the deadline: the status lines give FPS and the curve.
#   3. the same command with --device=cpu for 60 s: the GPU's share of the speed on the same machine.
#   (1b. between 1 and 2: Learner.train's env steps/s on cuda, benchmarks/scaling_model.py's --gpu_learner_sps.)
#
# Where gymnasium/ale-py are missing, wheels in .whl/ are installed to /tmp/site first.
# DEADLINE_S (default 540) bounds the whole script; each stage is cut so that the next one fits.
set -u
OUT=${OUT:-gpu_check_out}; mkdir -p "$OUT"
DEADLINE_S=${DEADLINE_S:-540}
T0=$(date +%s)
left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; python3 -c \
  "import torch, gymnasium, ale_py; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), 'gymnasium', gymnasium.__version__, 'ale_py', ale_py.__version__)"; } \
  2>&1 | tee "$OUT/info.txt"

echo "== 1. pytest tests/gpu ($(left) s left)"
timeout -s INT 240 python3 -m pytest tests/gpu -v -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -25

echo "== 1b. the scaling model's GPU input: Learner.train env steps/s on cuda ($(left) s left)"
timeout 120 python3 -c "
import sys; sys.path.insert(0, 'benchmarks')
import families, scaling_model as m
for name in ('atari_pong', 'doom_basic'):
    flags = [f for f in families.WORKLOADS[name] if not f.startswith('--device')]
    print(name, 'learner env steps/s on cuda:', round(1.0 / m.learner_seconds_per_step(flags, 'cuda', 10.0)))
" 2>&1 | tee "$OUT/learner_cuda.txt" | tail -3

PONG=$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import families; print(' '.join(families.WORKLOADS['atari_pong']))")
W=$(( $(nproc) - 4 )); [ $W -lt 2 ] && W=2
BIG="--num_workers=$W --num_envs_per_worker=4 --batch_size=1024 --num_batches_per_epoch=2"
COMMON="$PONG $BIG --train_dir=/tmp/gpu_check --restart_behavior=overwrite --with_progress_bar=False --experiment_summaries_interval=5"
GPU_S=$(( $(left) - 100 ))
echo "== 2. atari_pong on the GPU for ${GPU_S} s, towards 10M frames"
timeout -s INT $(( GPU_S + 30 )) python3 -m msf.train $COMMON --experiment=pong_gpu --device=gpu \
  --train_for_env_steps=10000000 --train_for_seconds=$GPU_S > "$OUT/pong_gpu.log" 2>&1
grep -E "frames [0-9]+ \| fps" "$OUT/pong_gpu.log" | tail -4
cp /tmp/gpu_check/pong_gpu/summary.json "$OUT/pong_gpu_summary.json" 2>/dev/null

CPU_S=$(( $(left) - 25 ))
echo "== 3. atari_pong with --device=cpu for ${CPU_S} s"
timeout -s INT $(( CPU_S + 20 )) python3 -m msf.train $COMMON --experiment=pong_cpu --device=cpu \
  --train_for_seconds=$CPU_S > "$OUT/pong_cpu.log" 2>&1
grep -E "frames [0-9]+ \| fps" "$OUT/pong_cpu.log" | tail -3
echo "== done in $(( $(date +%s) - T0 )) s"
