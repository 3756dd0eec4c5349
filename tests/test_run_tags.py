"""Run tags for the Runs page (backend at launch, cost after the step) on a real instance."""

import dagster as dg
from dagster._core.test_utils import create_run_for_test

from dagster_gpu.instance.run_tags import COST_TAG, RAN_ON_TAG, add_cost, ran_on, tag_launch
from dagster_gpu.core.request import GpuRequest


def test_tags_are_added_and_costs_add_up():
    with dg.instance_for_test() as instance:
        run = create_run_for_test(instance, tags={"dagster/partition": "a"})
        tag_launch(instance, run.run_id, "kubernetes", "mig-1g.10gb")
        add_cost(instance, run.run_id, 0.0125)
        add_cost(instance, run.run_id, 0.0000004)  # a second partition of the same (ranged) step
        tags = instance.get_run_by_id(run.run_id).tags
        assert tags[RAN_ON_TAG] == "kubernetes on mig-1g.10gb"
        assert tags[COST_TAG] == "0.012500"
        assert tags["dagster/partition"] == "a"
        add_cost(instance, "no-such-run", 1.0)  # never raises
        assert ran_on("local", None) == "local"


def test_tag_names_are_not_request_overrides():
    # run tags under dagster-gpu/ override the GPU request; ours must not be read as one
    assert not RAN_ON_TAG.startswith("dagster-gpu/") and not COST_TAG.startswith("dagster-gpu/")
    assert GpuRequest.from_tags({RAN_ON_TAG: "slurm", COST_TAG: "1.0"}) == GpuRequest()
