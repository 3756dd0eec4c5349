"""The base install is the orchestrator's: the demo code location loads, builds gpu_executor and its Slurm and
Kubernetes backends, and `dagster definitions validate` passes with torch, sentence-transformers,
huggingface_hub, lancedb, matplotlib, pynvml and dagster_k8s unimportable; what needs an extra fails with one line naming it.

The modules are blocked by a meta-path finder that a ``sitecustomize.py`` installs in every interpreter of the
test (the dagster CLI's too), so an import anywhere in the code location's closure — at module level or when
the executor is built — fails the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dagster_gpu.core.extras import EXTRA_MODULES, MissingExtra, require_extra

REPO = Path(__file__).resolve().parents[1]
BLOCKED = ("torch", "sentence_transformers", "huggingface_hub", "transformers", "lancedb", "matplotlib", "pynvml",
           "dagster_k8s")

SITECUSTOMIZE = textwrap.dedent(f"""
    import sys
    BLOCKED = {BLOCKED!r}

    class _Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}} (blocked: not in the base install)", name=name)
            return None

    sys.meta_path.insert(0, _Blocker())
""")

#: Imports the code location, builds gpu_executor from a config with slurm: and kubernetes: sections, builds
#: both remote backends, then asks the local backend and the model loader for a step that embeds.
SCRIPT = textwrap.dedent("""
    import sys, tempfile
    from pathlib import Path
    import dagster as dg
    from dagster._config import process_config
    import pipelines.definitions as location
    from dagster_gpu import gpu_executor
    from dagster_gpu.contracts import StepLaunch
    from dagster_gpu.core.request import GpuRequest

    raw = {"backend": "auto", "slurm": {"account": "research"},
           "kubernetes": {"namespace": "default", "image": "dagster-gpu:test", "kubeconfig": sys.argv[1]}}
    cfg = process_config(gpu_executor.config_schema.config_type, raw)
    assert cfg.success, cfg.errors
    job = location.defs.resolve_job_def("fortune_embeddings_job")
    from dagster._core.definitions.job_base import InMemoryJob
    ctx = dg.InitExecutorContext(job=InMemoryJob(job), executor_def=gpu_executor, executor_config=cfg.value,
                                 instance=dg.DagsterInstance.ephemeral())
    executor = gpu_executor.executor_creation_fn(ctx)
    handler = executor._step_handler
    print("candidates", sorted(handler.candidates))
    print("slurm", type(handler.backend("slurm")).__name__)
    print("kubernetes", type(handler.backend("kubernetes")).__name__)
    local = handler.backend("local")
    launch = StepLaunch(run_id="r", step_key="s", partition_keys=("a",), attempt=0, argv=("true",), env={},
                        request=GpuRequest(count=1), placement=None, tags={})
    try:
        local.launch(launch)
    except ModuleNotFoundError as e:
        print("local", str(e))
    from dagster_gpu.embedding.model import load_model
    try:
        load_model("all-MiniLM-L6-v2", device="cpu")
    except ModuleNotFoundError as e:
        print("model", str(e))
    print("loaded", sorted(m for m in sys.modules if m.split(".")[0] in {blocked}))
""")


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.fixture(scope="module")
def blocked_env(tmp_path_factory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("blocked")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    home = tmp_path_factory.mktemp("dagster_home")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "DAGSTER_HOME": str(home),
            "DAGSTER_GPU_CORPUS_URL": str(home / "corpus"), "DAGSTER_GPU_OUTPUT_URL": str(home / "out")}


def test_the_blocker_blocks(blocked_env):
    p = subprocess.run([sys.executable, "-c", "import torch"], env=blocked_env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "No module named 'torch' (blocked: not in the base install)" in p.stderr


def test_code_location_loads_and_builds_its_executor_without_the_embed_index_and_report_extras(blocked_env, tmp_path):
    script = SCRIPT.replace("{blocked}", repr(set(BLOCKED)))
    kubeconfig = tmp_path / "kubeconfig"  # never contacted: building the backend reads it only
    kubeconfig.write_text(KUBECONFIG)
    p = subprocess.run([sys.executable, "-c", script, kubeconfig], env=blocked_env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    out = dict(line.split(" ", 1) for line in p.stdout.splitlines())
    assert out["candidates"] == "['kubernetes', 'local', 'slurm']"
    assert out["slurm"] == "SlurmBackend" and out["kubernetes"] == "KubernetesBackend"
    assert out["local"] == ("the local backend needs the embed extra: pip install 'dagster-gpu[embed]' "
                            "(not installed: torch, sentence_transformers, huggingface_hub)")
    assert out["model"] == ("loading the model 'all-MiniLM-L6-v2' needs the embed extra: "
                            "pip install 'dagster-gpu[embed]' (not installed: torch, sentence_transformers, huggingface_hub)")
    assert out["loaded"] == "[]"


def test_dagster_definitions_validate_passes_without_the_extras(blocked_env, tmp_path):
    dagster = Path(sys.executable).with_name("dagster")
    p = subprocess.run([dagster, "definitions", "validate", "-m", "pipelines.definitions"], env=blocked_env,
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert "Validation successful for code location pipelines.definitions" in p.stdout + p.stderr


def test_a_missing_extra_is_one_line_naming_the_extra_and_its_modules(monkeypatch):
    require_extra("embed", "here")  # this environment has the embed extra: no error
    monkeypatch.setitem(EXTRA_MODULES, "report", ("matplotlib", "no_such_module_gt"))
    with pytest.raises(MissingExtra) as e:
        require_extra("report", "dagster-gpu report")
    assert str(e.value) == ("dagster-gpu report needs the report extra: pip install 'dagster-gpu[report]' "
                            "(not installed: no_such_module_gt)")
    assert e.value.name == "no_such_module_gt" and "\n" not in str(e.value)
