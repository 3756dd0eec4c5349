"""The bills' metadata keys: public names, written once in dagster_gpu.billing.keys."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import dagster_gpu
from dagster_gpu.billing import keys

PACKAGE = Path(dagster_gpu.__file__).resolve().parent


def test_the_public_key_names():
    assert (keys.GPU_SECONDS, keys.WALL_SECONDS, keys.DEVICES, keys.DEVICE_TYPE) == (
        "billing/gpu_seconds", "billing/wall_seconds", "billing/devices", "billing/device_type")
    assert (keys.RATE_USD_PER_GPU_HOUR, keys.COST_USD, keys.SOURCE, keys.NOTE) == (
        "billing/rate_usd_per_gpu_hour", "billing/cost_usd", "billing/source", "billing/note")
    assert (keys.UNIT_GPU_SECONDS, keys.UNIT_PARTITIONS, keys.MEASURED_GPU_SECONDS, keys.DIFFERENCE_GPU_SECONDS) == (
        "billing/unit_gpu_seconds", "billing/unit_partitions", "billing/measured_gpu_seconds",
        "billing/difference_gpu_seconds")
    names = [v for k, v in vars(keys).items() if k.isupper() and k not in ("PREFIX", "BILL_PREFIX")]
    assert all(v.startswith(keys.PREFIX) for v in names) and len(set(names)) == len(names) == 13


def test_the_scheduler_bills_keys_are_apart_from_the_measured_ones_and_old_ones_still_read():
    assert (keys.billed(keys.GPU_SECONDS), keys.billed(keys.UNIT_GPU_SECONDS), keys.billed(keys.SOURCE)) == (
        "bill/gpu_seconds", "bill/unit_gpu_seconds", "bill/source")
    assert (keys.billed(keys.GPU_SECONDS, cpu=True), keys.billed(keys.RATE_USD_PER_GPU_HOUR, cpu=True)) == (
        "bill/cpu_seconds", "bill/rate_usd_per_cpu_hour")
    with pytest.raises(ValueError, match="not a billing key: 'local/unit'"):
        keys.billed("local/unit")
    assert keys.bill_value({"bill/gpu_seconds": 2.0, "billing/gpu_seconds": 9.0}, keys.GPU_SECONDS) == 2.0
    assert keys.bill_value({"bill/cpu_seconds": 3.0}, keys.GPU_SECONDS) == 3.0
    assert keys.bill_value({"billing/gpu_seconds": 9.0}, keys.GPU_SECONDS) == 9.0  # written before bill/*
    assert keys.bill_value({}, keys.GPU_SECONDS) is None


def test_no_module_spells_a_billing_key_itself():
    literal = re.compile(r"^billing/[a-z_]*$")
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "billing" / "keys.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and literal.match(node.value):
                found.setdefault(str(path.relative_to(PACKAGE)), []).append(node.value)
    assert not found, found
