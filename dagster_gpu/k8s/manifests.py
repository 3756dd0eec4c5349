"""A step's Kubernetes objects, in one namespace for callers: re-exports of the three modules that build them.

* :mod:`dagster_gpu.k8s.names`: names, labels and annotations (valid and distinct for any input);
* :mod:`dagster_gpu.k8s.dra`: the DRA device request, the ResourceClaimTemplate, reading claims back;
* :mod:`dagster_gpu.k8s.pod`: the pod's settings, the pod (the user's container context merged as dagster-k8s
  does) and the handle read back from a pod.

All pure: no I/O, no cluster needed.
"""

from dagster_gpu.k8s.dra import (  # noqa: F401
    DRIVER,
    GPU_CLASS,
    MIG_CLASS,
    MIG_PROFILE,
    REQUEST_NAME,
    RESOURCE_API_VERSIONS,
    SHARING_STRATEGIES,
    AllocatedDevice,
    DeviceChoice,
    ManifestError,
    allocated_devices,
    allocated_requests,
    allocation,
    choice_from_json,
    claim_template,
    claim_template_for_version,
    device_choice,
    device_request,
    generated_claim_name,
    is_mig_profile,
    memory_selector,
    mig_device_class,
    newest_slices,
    product_selector,
    profile_selector,
    served_version,
    to_dict,
)
from dagster_gpu.k8s.names import (  # noqa: F401
    ANNOTATION_DEVICE_REQUEST,
    ANNOTATION_PARTITION_KEY,
    ANNOTATION_PLACEMENT_DEVICE,
    ANNOTATION_STEP_KEY,
    ENV_NAMESPACE,
    ENV_POD,
    LABEL_ATTEMPT,
    LABEL_MANAGED_BY,
    LABEL_PARTITION,
    LABEL_RUN_ID,
    LABEL_STEP_KEY,
    MANAGED_BY,
    object_name,
    partition_label,
    run_selector,
    sanitize_label_value,
    step_labels,
)
from dagster_gpu.k8s.pod import (  # noqa: F401
    CONTAINER_NAME,
    PodSettings,
    SecretEnv,
    build_pod,
    handle_from_pod,
    owner_reference,
    step_objects,
)
