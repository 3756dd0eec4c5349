#!/usr/bin/env bash
# Records a preemption with requeue on the local Slurm 22.05 cluster (resources/slurm/cluster.sh start):
# a 4-task --requeue array holds the node's 4 GPUs, a high-QOS job preempts one task, and squeue/sacct in
# our formats are written once a second to $OUT (default /tmp/rq) until the rerun has completed.
source "$(dirname "${BASH_SOURCE[0]}")/../../../../resources/lib/errtrap.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
export SLURM_CONF="${SLURM_CONF:-/tmp/dagster-gpu-slurm/etc/slurm.conf}"
OUT="${OUT:-/tmp/rq}"
mkdir -p "$OUT"
SQF=$(.venv/bin/python -c "from dagster_gpu.slurm import parse as P; print(P.SQUEUE_FORMAT)")
SAF=$(.venv/bin/python -c "from dagster_gpu.slurm import parse as P; print(P.SACCT_FORMAT)")
A=$(sbatch --parsable --account=research --qos=normal --requeue --gres=gpu:1 --array=0-3 --output=/dev/null --wrap="sleep 10")
echo "$A" > "$OUT/array"
until [ "$(squeue -h -j "$A" -t R | wc -l)" -ge 4 ]; do sleep 0.5; done
sbatch --parsable --account=research --qos=high --gres=gpu:1 --output=/dev/null --wrap="sleep 3" > "$OUT/hi"
for i in $(seq 1 400); do
  squeue --noheader --array --states=all --jobs="$A" -o "$SQF" > "$OUT/squeue.$i.txt"
  sacct --parsable2 --noheader --allocations --duplicates --allusers --jobs="$A" --format "$SAF" > "$OUT/sacct.$i.txt"
  if [ "$(grep -c "^${A}_0|.*|COMPLETED|" "$OUT/sacct.$i.txt" || true)" -ge 1 ] && [ "$(grep -c "^${A}_0|" "$OUT/sacct.$i.txt")" -ge 2 ]; then
    echo "rerun recorded after $i polls in $OUT"
    exit 0
  fi
  sleep 1
done
echo "the rerun did not complete within 400 polls" >&2
exit 1
