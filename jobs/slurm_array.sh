#!/bin/bash
# A batchspec job as a SLURM job array: array task i runs shard i of the input; every shard writes
# its own part files into the one output dir (outputs/<job>/ unless output.dir is set), so the union
# is every row exactly once. Submit from the directory the job's relative paths start from:
#
#   sbatch --array=0-7 jobs/slurm_array.sh job=demo
#   sbatch --array=0-7 -c 8 --mem=32G jobs/slurm_array.sh job=myjob drafter.k=6 batch_size=32
#   python -m batchspec.status outputs/myjob          # rows per shard, errors, missing shards
#
# shard.index / shard.count default to SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN and
# SLURM_ARRAY_TASK_COUNT, so 1-based arrays (--array=1-8) work too. Resubmitting the same command
# (the whole array) after a crash or a cancel resumes: rows already in part files are skipped, and
# finished shards exit 0 at once.
#
# Pre-emption and time-out (docs/slurm.md): batchspec runs as a job step (srun), so
# `scancel --signal=USR2 JOB` reaches it, and so does the USR2 that SLURM sends two minutes before
# the time limit (--signal below). batchspec then stops admitting rows, finishes the rows in flight,
# writes them and exits 140; this script then requeues the task (--requeue), which resumes where it
# stopped. A USR2 sent to the batch shell (`scancel --batch --signal=USR2`, or `--signal=B:USR2@...`)
# is passed on to it. At the time limit SLURM sends SIGTERM to every process and SIGKILL KillWait
# later: batchspec writes the rows that are complete and exits 143, and the task is requeued too.
# A plain `scancel` (SIGTERM, no time limit reached) also writes the complete rows, but is not
# requeued: it stays cancelled until you resubmit.
#SBATCH --job-name=batchspec
#SBATCH --array=0-7
#SBATCH --cpus-per-task=4
#SBATCH --mem=16G
#SBATCH --time=04:00:00
#SBATCH --signal=USR2@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%A_%a.out
set -uo pipefail

cd "${SLURM_SUBMIT_DIR:-.}"
if [ -f .venv/bin/activate ]; then source .venv/bin/activate; fi
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
cpus="${SLURM_CPUS_PER_TASK:-1}"
task="${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-?}}_${SLURM_ARRAY_TASK_ID:-0}"
echo "batchspec: task $task (job ${SLURM_JOB_ID:-?}) starting on $(hostname) at $(date '+%F %T'), restart ${SLURM_RESTART_COUNT:-0}"

# One task, as a job step: step signals (scancel --signal, --signal=USR2@120) go to batchspec itself.
# srun no longer takes --cpus-per-task from the job's environment (SLURM >= 22.05): pass it on.
srun --ntasks=1 --cpus-per-task="$cpus" python -m batchspec threads="$cpus" progress.mode=log "$@" &
child=$!
# USR2 to this batch shell only: pass it on (srun forwards it to batchspec). SIGTERM reaches every
# process of the job, batchspec included, so the shell only has to survive it to requeue.
trap 'kill -USR2 "$child" 2>/dev/null' USR2
trap ':' TERM
wait "$child"
status=$?
while [ "$status" -gt 128 ] && kill -0 "$child" 2>/dev/null; do   # `wait` returns early when a trap runs
    wait "$child"
    status=$?
done

requeue=no
if [ "$status" -eq 140 ]; then
    requeue=yes                                            # SIGUSR2: pre-emption or time-limit warning
elif [ "$status" -eq 143 ] && [ "$(squeue -h -j "${SLURM_JOB_ID:-0}" -o %r 2>/dev/null)" = TimeLimit ]; then
    requeue=yes                                            # SIGTERM at the time limit (not a scancel)
fi
if [ "$requeue" = yes ]; then
    echo "batchspec: stopped by a signal (exit $status) at $(date '+%F %T'); requeueing task $task to resume"
    scontrol requeue "${SLURM_JOB_ID}" || echo "batchspec: requeue failed; resubmit the array to resume" >&2
else
    echo "batchspec: task $task exit $status at $(date '+%F %T')"
fi
exit "$status"
