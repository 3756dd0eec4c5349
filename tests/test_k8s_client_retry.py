"""KubeClient's retry rule (pure): which failed API calls are tried again, and that the last error surfaces as is."""

from __future__ import annotations

import pytest
import urllib3
from kubernetes.client.rest import ApiException

from dagster_gpu.k8s.client import TIMEOUT, api_retry, transient


class Flaky:
    """Raises the given errors in turn, then returns "ok"; records the kwargs of each call."""

    def __init__(self, *errors):
        self.errors = list(errors)
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def test_transient_statuses_are_retried_with_the_request_timeout():
    fn = Flaky(ApiException(status=503, reason="Service Unavailable"), ApiException(status=429, reason="Too Many"))
    assert api_retry(fn, "pod-a", "ns", mutation=True) == "ok"
    assert fn.calls == [(("pod-a", "ns"), {"_request_timeout": TIMEOUT})] * 3


def test_a_definite_answer_is_not_retried_and_keeps_its_status():
    fn = Flaky(ApiException(status=404, reason="Not Found"))
    with pytest.raises(ApiException) as e:
        api_retry(fn, mutation=False)
    assert e.value.status == 404 and len(fn.calls) == 1


def test_the_last_transient_error_surfaces_after_the_attempts():
    fn = Flaky(*[ApiException(status=500, reason="Internal")] * 5)
    with pytest.raises(ApiException) as e:
        api_retry(fn, mutation=False, attempts=3)
    assert e.value.status == 500 and len(fn.calls) == 3


def test_connection_errors():
    refused = urllib3.exceptions.MaxRetryError(None, "/api", urllib3.exceptions.NewConnectionError(None, "refused"))
    read_timeout = urllib3.exceptions.ReadTimeoutError(None, "/api", "read timed out")
    assert transient(refused, mutation=True)  # never reached the server: safe to send again
    assert transient(read_timeout, mutation=False)
    assert not transient(read_timeout, mutation=True)  # a create/delete may have been applied
    assert not transient(ValueError("bad"), mutation=False)
    fn = Flaky(refused)
    assert api_retry(fn, mutation=True) == "ok" and len(fn.calls) == 2
