"""Kubernetes (DRA) support for gpu_executor's ``kubernetes`` backend.

``manifests`` builds Pods and ResourceClaimTemplates (pure); ``client`` talks to the API server.
The control plane used for tests lives in ``resources/k8s/`` (not part of the library).
"""
