"""pod_state on step pods recorded from the local control plane (tests/data/k8s/record_k8s_pods.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dagster_gpu.contracts import WorkerStatus
from dagster_gpu.executor.backends.kubernetes_pod_state import (
    PodTimeouts, needs_scheduler_events, pod_state, terminated, unschedulable_message,
)

DATA = Path(__file__).resolve().parent / "data" / "k8s"
T = PodTimeouts(pending_s=300.0, create_s=120.0)


def pod(case: str) -> dict:
    return json.loads((DATA / f"pod_{case}.json").read_text())


def test_succeeded_pod_finishes_with_exit_code_0():
    p = pod("succeeded")
    v = pod_state(p, 5.0, T)
    assert (v.state.status, v.state.exit_code, v.action) == (WorkerStatus.SUCCEEDED, 0, "finish")
    assert v.state.message == f"pod {p['metadata']['name']} Succeeded"
    assert terminated(p)["reason"] == "Completed"


def test_failed_pod_finishes_with_its_exit_code_the_kubelet_reason_and_its_logs_last_lines():
    p = pod("failed")  # the worker logged two lines and exited 7; FallbackToLogsOnError made them its message
    v = pod_state(p, 5.0, T)
    assert (v.state.status, v.state.exit_code, v.action) == (WorkerStatus.FAILED, 7, "finish")
    assert v.state.message == (f"pod {p['metadata']['name']} Failed (Error); termination message:\n"
                               "embedding 3 partitions\n"
                               "ValueError: corpus file bad.parquet: no text column")
    del p["status"]["containerStatuses"][0]["state"]["terminated"]["message"]  # policy File, or an empty log
    assert pod_state(p, 5.0, T).state.message == f"pod {p['metadata']['name']} Failed (Error)"


def test_running_pod_is_running():
    v = pod_state(pod("running"), 10_000.0, T)  # no timeout applies to a running pod
    assert (v.state.status, v.action) == (WorkerStatus.RUNNING, "none")


def test_unschedulable_pod_waits_with_the_schedulers_message_then_gives_up():
    p = pod("unschedulable")
    assert "cannot allocate all claims" in unschedulable_message(p)
    assert not needs_scheduler_events(p)  # the condition already says why
    v = pod_state(p, 10.0, T)
    assert (v.state.status, v.action) == (WorkerStatus.PENDING, "none")
    assert v.state.message == unschedulable_message(p)
    late = pod_state(p, 301.0, T)
    assert (late.state.status, late.action) == (WorkerStatus.FAILED, "give_up")
    assert late.state.message.startswith(f"pod dagster-gpu/{p['metadata']['name']} unschedulable for 301s "
                                         "(> pending_timeout_seconds=300): FailedScheduling: 0/1 nodes are available")


def test_unschedulable_without_a_condition_message_uses_the_event():
    p = pod("unschedulable")
    p["status"]["conditions"] = []
    assert needs_scheduler_events(p)
    v = pod_state(p, 10.0, T, scheduler_message="0/1 nodes are available: from the event")
    assert v.state.message == "0/1 nodes are available: from the event"
    assert pod_state(p, 400.0, T).state.message.endswith("FailedScheduling: the scheduler has not placed the pod")


def test_bound_pod_stuck_on_a_missing_secret_gives_up_after_the_create_timeout():
    p = pod("stuck")
    v = pod_state(p, 30.0, T)
    assert (v.state.status, v.state.message, v.action) == (WorkerStatus.PENDING, "CreateContainerConfigError", "none")
    late = pod_state(p, 121.0, T)
    assert (late.state.status, late.action) == (WorkerStatus.FAILED, "give_up")
    assert late.state.message == (
        f"pod dagster-gpu/{p['metadata']['name']} bound to gpu-node-0 but not started after 121s "
        "(> create_timeout_seconds=120): CreateContainerConfigError: secret 'no-such-secret': 404 Not Found")


@pytest.mark.parametrize("case", ["running", "unschedulable", "stuck"])
def test_a_terminating_pod_is_running_until_it_is_gone(case):
    p = pod(case)
    p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    v = pod_state(p, 10_000.0, T)
    assert (v.state.status, v.state.message, v.action) == (WorkerStatus.RUNNING, "pod is terminating", "none")
