"""What a unit covers, in each backend's messages and scheduler-side objects: a ranged unit names its range
(``3 partitions 'p001'…'p003'``), never "unpartitioned run" or ``None``. No cluster: the Kubernetes backend's
client is a recorder that can refuse, the Slurm coalescer's sbatch a stand-in that accepts or refuses."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException

from dagster_gpu.contracts import StepLaunch
from dagster_gpu.k8s.backend import KubernetesBackend
from dagster_gpu.k8s import manifests as m
from dagster_gpu.policy.placement import Placement
from dagster_gpu.core.request import GpuRequest
from dagster_gpu.slurm.client import SlurmClient, SlurmRejected, SubmittedJob
from dagster_gpu.slurm.coalescer import ArrayCoalescer, SubmissionRejected, TaskRequest, steps_covered
from dagster_gpu.slurm.spool import Spool
from dagster_gpu.slurm.window import WindowRule

RANGE = ("p001", "p002", "p003")
DATA = Path(__file__).resolve().parent / "data" / "slurm"


def _launch(keys: tuple[str, ...]) -> StepLaunch:
    return StepLaunch(run_id="r-1", step_key="embed", partition_keys=keys, attempt=0, argv=("python",), env={},
                      request=GpuRequest(), placement=Placement(backend="kubernetes", reason="test"))


# ------------------------------------------------------------------------------------------ Kubernetes
class _NoWatch:
    def start(self):
        pass

    def wait_synced(self, timeout):
        return True


class _RefusingKube:
    """Refuses every pod as the API server does: an ApiException with the status, reason and Status body."""

    namespace = "ns"

    def __init__(self):
        self.pods: list[dict] = []
        self.deleted: list[str] = []

    def create_claim_template(self, body):
        pass

    def delete_claim_template(self, name):
        self.deleted.append(name)

    def create_pod(self, body):
        self.pods.append(body)
        e = ApiException(status=403, reason="Forbidden")
        e.body = '{"kind":"Status","status":"Failure","reason":"Forbidden","code":403}'
        raise e


def test_kubernetes_launch_error_names_the_range():
    kube = _RefusingKube()
    b = KubernetesBackend(kube, m.PodSettings(namespace="ns", secret_env=()), rates={"default": 1.0})
    b.claims = _NoWatch()
    with pytest.raises(RuntimeError) as e:
        b.launch(_launch(RANGE))
    name = kube.pods[0]["metadata"]["name"]
    assert str(e.value).startswith(f"creating pod {name} for 3 partitions 'p001'…'p003': 403 Forbidden: ")
    assert kube.deleted == [name]  # the refused pod's ResourceClaimTemplate is not left behind
    with pytest.raises(RuntimeError, match=r"for unpartitioned run: 403"):
        b.launch(_launch(()))


def test_kubernetes_pod_labels_a_range_and_annotates_a_single_key():
    ranged, _, _ = m.step_objects(_launch(RANGE), m.PodSettings())
    assert ranged.metadata.labels[m.LABEL_PARTITION] == m.partition_label(RANGE)
    assert ranged.metadata.labels[m.LABEL_PARTITION].startswith("p001..p003-")
    assert m.ANNOTATION_PARTITION_KEY not in ranged.metadata.annotations
    single, _, _ = m.step_objects(_launch(("doc 1.txt",)), m.PodSettings())
    assert single.metadata.annotations[m.ANNOTATION_PARTITION_KEY] == "doc 1.txt"
    assert single.metadata.labels[m.LABEL_PARTITION] == m.sanitize_label_value("doc 1.txt")
    none, _, _ = m.step_objects(_launch(()), m.PodSettings())
    assert m.LABEL_PARTITION not in none.metadata.labels and m.ANNOTATION_PARTITION_KEY not in none.metadata.annotations


# ------------------------------------------------------------------------------------------ Slurm
def test_steps_covered_words_each_step_of_a_submission():
    assert steps_covered([RANGE, ("q",), ()]) == "3 partitions 'p001'…'p003', partition 'q', unpartitioned run"


@dataclass
class _Sbatch(SlurmClient):
    """sbatch that accepts (job ids 900, 901, …) or refuses with the 22.05 recorded account rejection."""

    refuse: bool = False
    submitted: list[list[str]] = field(default_factory=list)

    def submit_job(self, script, options, *, script_args=(), attempts=None):
        self.submitted.append(list(options))
        if self.refuse:
            stderr = (DATA / "sbatch_reject_account.stderr.txt").read_text()
            raise SlurmRejected(["sbatch", *options], 1, stderr.strip().split("error: ", 1)[-1], stderr)
        return SubmittedJob(900 + len(self.submitted) - 1)

    def max_array_size(self) -> int:
        return 1001


def _coalescer(tmp_path, refuse: bool) -> tuple[ArrayCoalescer, Spool]:
    spool = Spool(tmp_path / "spool")
    return ArrayCoalescer(spool, _Sbatch(refuse=refuse), python="python3", rule=WindowRule(0.0, 0.0, 0.0), max_wait_s=10), spool


def _request(keys: tuple[str, ...]) -> TaskRequest:
    return TaskRequest(options=("--account=nobody",), throttle=0, argv=("true",), env={}, run_id="r", step_key="s",
                       partition_keys=keys)


def test_slurm_rejection_names_the_range_and_lists_its_keys(tmp_path):
    co, _ = _coalescer(tmp_path, refuse=True)
    with pytest.raises(SubmissionRejected) as e:
        co.submit(_request(RANGE))
    assert "the job array of 1 step(s) (3 partitions 'p001'…'p003'): Batch job submission failed: Invalid account" in str(e.value)
    assert "None" not in str(e.value) and e.value.partitions == list(RANGE)


def test_slurm_manifest_entry_says_what_the_task_covers(tmp_path):
    co, spool = _coalescer(tmp_path, refuse=False)
    a = co.submit(_request(RANGE))
    manifest = json.loads((spool.batch_dir(a.batch) / "manifest.json").read_text())
    entry = manifest["tasks"][a.array_task_id]
    assert entry["covers"] == "3 partitions 'p001'…'p003'" and "partition_key" not in entry
