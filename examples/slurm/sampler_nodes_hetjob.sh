#!/bin/bash
# Learners on a GPU node, sampler nodes on CPU nodes: one Slurm heterogeneous job (docs/slurm.md). Submit it with
# `sbatch sampler_nodes_hetjob.sh` from a folder on the shared file system (the key is made there).
#SBATCH --job-name=pong_fed
#SBATCH --time=04:00:00
#SBATCH --nodes=1 --ntasks=1 --gres=gpu:4 --cpus-per-task=16  # component 0: the learners (one node, 4 device groups)
#SBATCH hetjob
#SBATCH --nodes=4 --ntasks-per-node=1 --cpus-per-task=64      # component 1: the sampler nodes (CPU only)

# one key for both components, on the shared file system, made before either starts
KEY=$SLURM_SUBMIT_DIR/$SLURM_JOB_NAME.sampler.key
[ -f "$KEY" ] || (umask 077 && python -c "import secrets; print(secrets.token_hex(32))" >"$KEY")
# the learner component's node: the sampler nodes connect to it
LEARNER=$(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0" | head -n1)
PORT=29600

srun --het-group=0 msf-train --env=atari_pong --experiment="$SLURM_JOB_NAME" --nnodes=1 --nproc_per_node=4 \
	--num_workers=0 --sampler_port=$PORT --sampler_bind=0.0.0.0 --sampler_key_file="$KEY" &
LEARNERS=$!
srun --het-group=1 msf-sampler --connect="$LEARNER:$PORT" --sampler_key_file="$KEY" \
	--num_workers=64 --num_envs_per_worker=8 --connect_timeout=300 &
SAMPLERS=$!
# the job fails when either component does
wait $LEARNERS && LEARNERS_RC=0 || LEARNERS_RC=$?
wait $SAMPLERS && SAMPLERS_RC=0 || SAMPLERS_RC=$?
echo "learners exited $LEARNERS_RC, sampler nodes exited $SAMPLERS_RC"
exit $((LEARNERS_RC != 0 || SAMPLERS_RC != 0))
