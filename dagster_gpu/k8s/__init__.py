"""Kubernetes (DRA) support, and gpu_executor's ``kubernetes`` backend.

``manifests`` builds Pods and ResourceClaimTemplates (pure); ``client`` talks to the API server; ``pod_state``
and ``billing`` are the pure rules for a step pod's state and its pod-interval bill; ``backend`` is the
backend gpu_executor builds from its ``kubernetes:`` section (``settings``); ``claim`` runs in the step pod
and reads its own ResourceClaim. The control plane used for tests lives in ``resources/k8s/`` (not part of
the library).
"""
