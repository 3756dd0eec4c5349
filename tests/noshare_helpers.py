"""The nothing-shared set-up on the 24.11 test cluster, for tests/test_slurm_rest_noshare_e2e.py and
bench/rest_noshare.py: a spool the compute side cannot see (resources/slurm/trixie.sh ``mask-noshare``: an empty
read-only tmpfs over ``<root>/host$NOSHARE_DIR``, while the root's own /var/tmp was never bind-mounted), channels,
manifests and logs on an S3 endpoint, the store's credentials only in the tasks' 0600 env_files file."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

from tests import slurm_helpers as H


def noshare_dir() -> Path:
    """The host directory the 24.11 cluster's compute side cannot see (``trixie.sh mask-noshare``, idempotent).
    Raises RuntimeError with the script's words when it fails."""
    cp = subprocess.run(["bash", str(H.TRIXIE_SH), "mask-noshare"], capture_output=True, text=True, timeout=60)
    if cp.returncode != 0 or not cp.stdout.strip():
        raise RuntimeError(f"trixie.sh mask-noshare failed (rc {cp.returncode}): {cp.stderr.strip()[-500:]}")
    return Path(cp.stdout.strip().splitlines()[-1])


def noshare_env(env: dict[str, str], home: Path, endpoint: str, bucket: str) -> tuple[dict[str, str], dict[str, str], str]:
    """``env`` (a rest_home environment: transport rest, token file, ``DGPU_TEST_ENV_FILE``) turned nothing-shared:
    the spool under :func:`noshare_dir`, ``events: relay`` with ``relay_url`` ``s3://<bucket>/<fresh prefix>`` on
    ``endpoint``, the tasks off the database (slurm_helpers.no_database_env), and S3 credentials with a unique
    secret appended to the env_files file (0600). Returns (env, the credentials, the prefix)."""
    spool = noshare_dir() / uuid.uuid4().hex / "spool"
    secret = f"noshare-{uuid.uuid4().hex}"  # moto takes any key; a unique one can be searched for
    creds = {"AWS_ACCESS_KEY_ID": "noshare-e2e", "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": "us-east-1"}
    with open(env["DGPU_TEST_ENV_FILE"], "a") as f:
        f.writelines(f"{k}={v}\n" for k, v in creds.items())
    prefix = f"noshare/{uuid.uuid4().hex}"
    out = {**env, **H.no_database_env(home), **creds, "DAGSTER_GPU_SLURM_SPOOL": str(spool),
           "DGPU_TEST_HOST_SPOOL": str(spool), "DGPU_TEST_RELAY_URL": f"s3://{bucket}/{prefix}",
           "DGPU_TEST_RELAY_ENDPOINT": endpoint}
    return out, creds, prefix
