"""The 24.11 test cluster's slurmrestd (resources/slurm/trixie.sh: Debian trixie's slurmrestd with auth/jwt on
127.0.0.1, ``DAGSTER_GPU_SLURM_TRIXIE_REST_PORT``, default 6820) for the rest transport's tests: its URL, whether it
answers, and tokens written to 0600 files (``trixie.sh token``, ``scontrol token``; never in an argv of ours)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import urllib3

from tests import slurm_helpers as H

URL = os.environ.get("DAGSTER_GPU_SLURMRESTD_URL") or f"http://127.0.0.1:{os.environ.get('DAGSTER_GPU_SLURM_TRIXIE_REST_PORT', '6820')}"


def unavailable_reason() -> str | None:
    """None when slurmrestd answers on :data:`URL`, else why not (for pytest.skip)."""
    try:
        urllib3.PoolManager(retries=False).request("GET", URL + "/openapi/v3", timeout=5.0)
    except urllib3.exceptions.HTTPError as e:
        return f"slurmrestd does not answer on {URL} ({type(e).__name__}); run: bash resources/slurm/trixie.sh start"
    return None


def write_token(path: Path, lifespan_s: int = 3600, user: str = "root") -> Path:
    """A fresh JWT for ``user`` (``trixie.sh token <lifespan> <user> <path>``) in ``path``, mode 0600 from the
    start. Returns ``path``."""
    cp = subprocess.run(["bash", str(H.TRIXIE_SH), "token", str(lifespan_s), user, str(path)], capture_output=True, text=True, timeout=60)
    if cp.returncode != 0 or not path.exists():
        raise RuntimeError(f"trixie.sh token failed (rc {cp.returncode}): {cp.stderr.strip()[-500:]}")
    return path
