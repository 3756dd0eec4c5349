#!/usr/bin/env bash
# Issue 9 benchmark on an NVIDIA GPU (written for the H200 device machine), one short script:
#   1. fp32: bench/embed_throughput.py on CUDA — our read -> embed -> write step vs a raw
#      SentenceTransformer.encode on the same texts, sides alternating, NVML busy % sampled per phase;
#   2. fp16: the same with both sides' model in float16;
#   3. e2e: 1,000,000 short fortune texts (<= 80 characters) through ONE embed_partition call (fp16), with
#      NVML busy % over the whole call;
#   3b. multi-GPU: bench/multi_gpu.py, the Encoder on every visible GPU (a model replica per device, batches
#      spread; on a one-GPU machine two replicas on that GPU) vs the Encoder on one device, same texts:
#      texts/s ratio, min cosine (target >= 0.9999), per-device NVML busy % and share of the model batches;
#   4. where the host side stops feeding the device: the fp16 A/B again with SWEEP_THREADS tokenizer threads
#      (fewer than the default cpus-1), and bench/gil_convoy.py (CPU only) with that many host threads and
#      with cpus-1: how much the tokenizer/writer threads slow the thread that launches the model.
# Targets (issue 9): GPU busy >= 90 % during the encode phase; texts/s >= 2 x raw encode (fp32 and fp16).
#
# Needs python3 with torch, sentence-transformers, pyarrow, fsspec and nvidia-ml-py (all in the device
# image; nothing is pip-installed) and .whl/ from `bash bench/prepare_gpu_check.sh` (the model with fp16
# weights, upcast here to an fp32 directory; a copy of the fortune files): carry .whl in the device run.
# Time: at most 6 minutes on an H200 for steps 1-3 (3b: at most MULTI_LIMIT 90 s more; step 4: at most 3 more), every step under its own `timeout`: model preparation <= 60 s (~10 s),
# each A/B <= AB_LIMIT 95 s (loading, warm-up, BUDGET 40 s of timed reps: --texts is lowered to fit),
# the e2e <= E2E_LIMIT 140 s (1 M texts need >= ~8k texts/s to finish in it). A failed step 3b is reported
# and skipped (its figures are then absent from the summary); every other failed step stops the script.
#
#   bash bench/gpu_check.sh      # env: TEXTS (200000) BATCH (512) REPS (3) BUDGET (40) AB_LIMIT (95) E2E_LIMIT (140)
#                                #      E2E_TEXTS (1000000) E2E_DTYPE (float16) READ_ROWS (4096)
#                                #      SWEEP_THREADS ("4 8"; empty: skip step 4) SWEEP_BUDGET (20)
#                                #      MULTI_TEXTS (60000; 0: skip step 3b) MULTI_DEVICES (auto) MULTI_LIMIT (90)
#
# With $OUT set it writes $OUT/gpu_check.log, $OUT/gpu_fp32.json, $OUT/gpu_fp16.json, $OUT/gpu_e2e.json,
# $OUT/gpu_multi.json and $OUT/gpu_check_summary.json (the figures for bench/results/summary.json).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TEXTS=${TEXTS:-200000}
BATCH=${BATCH:-512}
REPS=${REPS:-3}
BUDGET=${BUDGET:-40}
READ_ROWS=${READ_ROWS:-4096}
E2E_TEXTS=${E2E_TEXTS:-1000000}
E2E_DTYPE=${E2E_DTYPE:-float16}
AB_LIMIT=${AB_LIMIT:-95}
SWEEP_THREADS=${SWEEP_THREADS-4 8}
SWEEP_BUDGET=${SWEEP_BUDGET:-20}
E2E_LIMIT=${E2E_LIMIT:-140}
MULTI_TEXTS=${MULTI_TEXTS:-60000}
MULTI_DEVICES=${MULTI_DEVICES:-auto}
MULTI_LIMIT=${MULTI_LIMIT:-90}
OUTDIR=${OUT:-$(mktemp -d /tmp/gpu_check.XXXXXX)}
mkdir -p "$OUTDIR"
LOG="$OUTDIR/gpu_check.log"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
CURRENT=start
trap 'echo "gpu_check: step \"$CURRENT\" failed (exit $?); log: $LOG" >&2' ERR
exec > >(tee -a "$LOG") 2>&1

CURRENT="environment"
echo "== gpu_check $(date -u +%FT%TZ) on $(hostname); output in $OUTDIR"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || echo "nvidia-smi failed (continuing)"
"$PY" -c "import sys, os, torch, sentence_transformers, transformers, tokenizers, pyarrow, fsspec, pynvml; print('python', sys.version.split()[0], '| torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), '| sentence-transformers', sentence_transformers.__version__, '| transformers', transformers.__version__, '| tokenizers', tokenizers.__version__, '| pyarrow', pyarrow.__version__, '| cpus', os.cpu_count(), len(os.sched_getaffinity(0)))"

CURRENT="model preparation"
[ -d .whl/minilm-l6-v2-fp16 ] || { echo "no .whl/minilm-l6-v2-fp16: run bench/prepare_gpu_check.sh here and carry .whl"; exit 2; }
MODEL=/tmp/minilm-l6-v2-fp32
timeout 60 "$PY" - "$MODEL" <<'EOF'
import shutil, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
src, dst = Path(".whl/minilm-l6-v2-fp16"), Path(sys.argv[1])
if dst.exists():
    shutil.rmtree(dst)
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors"))
t = load_file(str(src / "model.safetensors"))
save_file({k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in t.items()},
          str(dst / "model.safetensors"), metadata={"format": "pt"})
print("model:", dst)
EOF
FORTUNES=/usr/share/games/fortunes
[ -d "$FORTUNES" ] || FORTUNES=.whl/fortunes

run_ab() {  # $1 = dtype, $2 = name, then extra embed_throughput arguments
  CURRENT="A/B $2"
  echo "== $CURRENT: $TEXTS texts, batch $BATCH, read batch $READ_ROWS, $REPS reps each side, budget ${BUDGET}s ${*:3}"
  timeout "$AB_LIMIT" "$PY" bench/embed_throughput.py --device cuda --model "$MODEL" --fortunes-dir "$FORTUNES" \
    --dtype "$1" --texts "$TEXTS" --batch-size "$BATCH" --read-batch-rows "$READ_ROWS" --reps "$REPS" \
    --max-seconds "$BUDGET" --nvml --nvml-interval 0.1 --json "$OUTDIR/gpu_$2.json" "${@:3}"
}
run_ab float32 fp32
run_ab float16 fp16

CURRENT="e2e $E2E_TEXTS short texts"
echo "== $CURRENT ($E2E_DTYPE, batch $BATCH)"
timeout "$E2E_LIMIT" "$PY" bench/embed_throughput.py --device cuda --model "$MODEL" --fortunes-dir "$FORTUNES" \
  --dtype "$E2E_DTYPE" --e2e-texts "$E2E_TEXTS" --batch-size "$BATCH" --read-batch-rows "$READ_ROWS" \
  --nvml --nvml-interval 0.1 --json "$OUTDIR/gpu_e2e.json"

if [ "$MULTI_TEXTS" -gt 0 ]; then
  CURRENT="multi-GPU $MULTI_DEVICES"
  echo "== $CURRENT: $MULTI_TEXTS texts ($E2E_DTYPE, batch $BATCH): every visible GPU vs one"
  rm -f "$OUTDIR/gpu_multi.json"
  timeout "$MULTI_LIMIT" "$PY" bench/multi_gpu.py --model "$MODEL" --fortunes-dir "$FORTUNES" --dtype "$E2E_DTYPE" \
    --texts "$MULTI_TEXTS" --batch-size "$BATCH" --read-batch-rows "$READ_ROWS" --devices "$MULTI_DEVICES" \
    --nvml-interval 0.1 --json "$OUTDIR/gpu_multi.json" \
    || echo "gpu_check: step \"$CURRENT\" failed (exit $?), continuing without its figures"
fi

CURRENT="summary"
"$PY" - "$OUTDIR" <<'EOF'
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
fp32, fp16, e2e = (json.loads((d / f"gpu_{k}.json").read_text()) for k in ("fp32", "fp16", "e2e"))
util = lambda r: (r.get("gpu_util_median_of_means") or {}).get("pipeline")
s = {
    "gpu": fp32.get("gpu"),
    "encoder.gpu_busy_percent": util(fp32),
    "encoder.gpu_busy_percent_fp16": util(fp16),
    "encoder.gpu_ratio_vs_encode": fp32["ratio"],
    "encoder.gpu_ratio_vs_encode_fp16": fp16["ratio"],
    "encoder.gpu_min_cosine": fp32["min_cosine"], "encoder.gpu_min_cosine_fp16": fp16["min_cosine"],
    "encoder.gpu_e2e_texts": e2e["texts"], "encoder.gpu_e2e_texts_per_s": e2e["texts_per_s"],
    "encoder.gpu_e2e_busy_percent": e2e["gpu_util_mean"],
}
multi = d / "gpu_multi.json"
if multi.exists():  # step 3b (bench/multi_gpu.py)
    m = json.loads(multi.read_text())
    s.update({
        "encoder.multi_gpu_devices": m["devices"],
        "encoder.multi_gpu_ratio_vs_one_device": m["ratio_vs_one_device"],
        "encoder.multi_gpu_min_cosine": m["min_cosine"],
        "encoder.multi_gpu_busy_percent": m["all"]["busy_percent"],
        "encoder.multi_gpu_batch_share": m["all"]["batch_share"],
    })
(d / "gpu_check_summary.json").write_text(json.dumps(s, indent=2))
print(json.dumps(s, indent=2))
EOF
for n in $SWEEP_THREADS; do
  BUDGET=$SWEEP_BUDGET REPS=2 run_ab float16 "fp16_tok$n" --tokenizer-threads "$n"
done
if [ -n "$SWEEP_THREADS" ]; then
  for n in ${SWEEP_THREADS%% *} $(( $(nproc) - 1 )); do
    CURRENT="gil_convoy $n host threads"
    echo "== $CURRENT"
    timeout 60 "$PY" bench/gil_convoy.py --model "$MODEL" --fortunes-dir "$FORTUNES" --threads "$n" --seconds 4 \
      --json "$OUTDIR/gil_convoy_$n.json"
  done
fi
nvidia-smi --query-gpu=utilization.gpu,memory.used,clocks.sm,temperature.gpu,power.draw --format=csv || true
echo "== gpu_check done"
