#!/bin/bash
# A batchspec job as a SLURM job array: array task i runs shard i of the input; every shard writes
# its own part files into the one output dir (outputs/<job>/ unless output.dir is set), so the union
# is every row exactly once. Submit from the repository root:
#
#   sbatch --array=0-7 jobs/slurm_array.sh job=demo
#   sbatch --array=0-7 jobs/slurm_array.sh job=myjob drafter.k=6 batch_size=32
#
# shard.index / shard.count default to SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN and
# SLURM_ARRAY_TASK_COUNT, so 1-based arrays (--array=1-8) work too. Resubmitting the same command
# after a time-out, crash or pre-emption resumes: rows already in part files are skipped, finished
# shards exit 0 at once. SLURM sends SIGUSR2 two minutes before the time limit (--signal below);
# batchspec then stops admitting rows, writes the finished ones and exits 140, and this script
# requeues the task so it resumes by itself.
#SBATCH --job-name=batchspec
#SBATCH --array=0-7
#SBATCH --cpus-per-task=4
#SBATCH --mem=16G
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR2@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%A_%a.out
set -uo pipefail

cd "${SLURM_SUBMIT_DIR:-.}"
if [ -f .venv/bin/activate ]; then source .venv/bin/activate; fi
export OMP_WAIT_POLICY=PASSIVE          # no busy-waiting threads on shared nodes
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"

python -m batchspec "$@" threads="${SLURM_CPUS_PER_TASK:-1}" progress.mode=log &
child=$!
# The signal goes to this batch shell (B: above); pass it on to batchspec.
trap 'kill -USR2 "$child" 2>/dev/null' USR2 TERM
status=0
wait "$child" || status=$?
while kill -0 "$child" 2>/dev/null; do   # `wait` returns early when a trapped signal arrives
    status=0
    wait "$child" || status=$?
done

if [ "$status" -eq 140 ] || [ "$status" -eq 143 ]; then   # stopped by SIGUSR2 / SIGTERM: not finished yet
    echo "batchspec stopped by a signal (exit $status); requeueing ${SLURM_ARRAY_JOB_ID:-?}_${SLURM_ARRAY_TASK_ID:-?}"
    scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
fi
exit "$status"
