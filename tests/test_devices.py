"""A unit's devices: CUDA_VISIBLE_DEVICES read by torch's rules, the device list of a unit, the replicas that
spread model batches over several devices (hand-out order, result order, errors), and the Encoder on 2 and 3
CPU replicas of the packaged MiniLM against one device: the same rows, in the same order, the same vectors.

The CUDA_VISIBLE_DEVICES cases follow torch v2.15.0 ``torch/cuda/__init__.py`` ``_parse_visible_devices``
(the CUDA runtime's rules: a ``GPU-``/``MIG-`` list up to the first other entry, ``strtoul`` numbers up to the
first invalid or negative one, a repeat hides every device); Slurm's ``NoDevFiles`` (``src/plugins/gres/common/
gres_common.c``, set when a job has no GPU files) and the NVIDIA container runtime's ``void`` are such invalid
entries.
"""

from __future__ import annotations

import json
import random
import threading
import time

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from dagster import instance_for_test

from dagster_gpu.embedding.chunking import TokenChunks
from dagster_gpu.embedding.devices import (DeviceReplicas, device_labels, normalize_device, replicate, unit_devices,
                                           visible_devices)
from dagster_gpu.embedding.encoder import Encoder
from dagster_gpu.embedding.model import load_model

from test_encoder import TEXTS, cosines


@pytest.mark.parametrize("value, entries", [
    ("0,1", ["0", "1"]),
    ("2, 3", ["2", "3"]),
    ("1gpu2,2ampere", ["1", "2"]),           # strtoul: the leading digits
    ("0,-1,2", ["0"]),                        # a negative entry ends the list
    ("0,void,1", ["0"]),                      # so does one that is not a number
    ("0,0", []),                              # a repeated entry hides every device
    ("GPU-8f6c2a3e-1b7d-4a9e-9c0f-3e2d1a0b9c8d,GPU-1d2c3b4a-5e6f-4a8b-9c0d-1e2f3a4b5c6d",
     ["GPU-8f6c2a3e-1b7d-4a9e-9c0f-3e2d1a0b9c8d", "GPU-1d2c3b4a-5e6f-4a8b-9c0d-1e2f3a4b5c6d"]),
    ("GPU-aaaa,0,GPU-bbbb", ["GPU-aaaa"]),    # a UUID list ends at the first entry without its prefix
    ("GPU-aaaa,GPU-aaaa", []),
    ("MIG-0c3c2b9e-7b0f-5e31-a2d4-6f1e0d9c8b7a", ["MIG-0c3c2b9e-7b0f-5e31-a2d4-6f1e0d9c8b7a"]),
    ("MIG-a,GPU-b", ["MIG-a"]),
    ("", []),
    ("void", []),
    ("NoDevFiles", []),
    ("-1", []),
    (None, None),                             # unset: every device
])
def test_visible_devices_follow_torchs_rules(value, entries):
    assert visible_devices(value) == entries


def test_unit_devices():
    assert unit_devices("auto", cuda_count=2) == ["cuda:0", "cuda:1"]
    assert unit_devices("cuda", cuda_count=3) == ["cuda:0", "cuda:1", "cuda:2"]
    assert unit_devices("auto", cuda_count=0) == ["cpu"]
    assert unit_devices("cuda", cuda_count=0) == ["cuda:0"]  # fails where the model is loaded, as before
    assert unit_devices("cuda:1", cuda_count=4) == ["cuda:1"]  # a pinned device: that one only
    assert unit_devices("CPU ", cuda_count=4) == ["cpu"]
    assert unit_devices(["cuda:1", "cuda", "cuda:1"]) == ["cuda:1", "cuda:0", "cuda:1"]
    assert unit_devices("auto") == (["cpu"] if not torch.cuda.is_available()
                                    else [f"cuda:{i}" for i in range(torch.cuda.device_count())])
    with pytest.raises(ValueError, match="empty list"):
        unit_devices([])
    with pytest.raises(ValueError, match="'cuda:x'"):
        unit_devices(["cuda:x"])
    assert normalize_device("cuda", current_cuda=2) == "cuda:2"


def test_device_labels_name_the_schedulers_entry():
    env = {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}
    assert device_labels(["cuda:0", "cuda:1"], ["NVIDIA H200", "NVIDIA H200"], env) == [
        "cuda:0 NVIDIA H200 (GPU-aaaa)", "cuda:1 NVIDIA H200 (GPU-bbbb)"]
    assert device_labels(["cuda:0", "cuda:1"], ["NVIDIA A100", None], {"CUDA_VISIBLE_DEVICES": "3,5"}) == [
        "cuda:0 NVIDIA A100 (3)", "cuda:1 (5)"]
    assert device_labels(["cuda:0"], ["NVIDIA H200"], {}) == ["cuda:0 NVIDIA H200"]  # a DRA pod: no variable
    assert device_labels(["cpu"], None, {}) == ["cpu"]


def test_replicas_hand_batches_out_in_order_and_return_them_in_order():
    """Three "devices" that finish out of order: every item runs once, results come back in item order, every
    device took a share, and a later map's items start after an earlier one's."""
    started: list[tuple[str, int]] = []
    lock = threading.Lock()
    rng = random.Random(7)
    delays = [rng.uniform(0, 0.01) for _ in range(60)]

    def run(device: str, item: int) -> tuple[str, int]:
        with lock:
            started.append((device, item))
        time.sleep(delays[item % len(delays)])
        return device, item * item

    pool = DeviceReplicas(["dev-a", "dev-b", "dev-c"], run)
    try:
        first, second = pool.map(list(range(30))), pool.map(list(range(30, 60)))
        got = first.wait(10) + second.wait(10)
        assert [v for _, v in got] == [i * i for i in range(60)]
        assert [i for _, i in started] == list(range(60))  # handed out in order from one queue
        by_device = {d: sum(1 for dd, _ in got if dd == d) for d in ("dev-a", "dev-b", "dev-c")}
        assert all(n >= 5 for n in by_device.values()), by_device
        assert sorted(pool.items_done) == sorted(by_device.values()) and sum(pool.items_done) == 60
        assert pool.map([]).wait(1) == []
    finally:
        pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.map([1])


def test_a_failed_batch_is_raised_and_the_replicas_go_on():
    def run(device: str, item: int) -> int:
        if item in (3, 5):
            raise ValueError(f"batch {item} failed on {device}")
        return item

    pool = DeviceReplicas(["a", "b"], run)
    try:
        with pytest.raises(ValueError, match="batch 3 failed"):  # the first failed item, by item order
            pool.map(list(range(8))).wait(10)
        assert pool.map([10, 11]).wait(10) == [10, 11]
    finally:
        pool.close()


def test_close_fails_queued_batches_instead_of_hanging():
    gate = threading.Event()
    pool = DeviceReplicas(["a"], lambda d, item: gate.wait(10) and item)
    job = pool.map([1, 2, 3])
    time.sleep(0.05)  # item 1 is running, 2 and 3 queued
    closer = threading.Thread(target=pool.close)
    closer.start()
    time.sleep(0.05)
    gate.set()
    closer.join(10)
    with pytest.raises(RuntimeError, match="closed before this batch ran"):
        job.wait(10)


@pytest.fixture(scope="module")
def model():
    """The packaged MiniLM on CPU, torch on one thread (the replicas are the parallelism here; torch's own
    threads on top would oversubscribe a 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model("all-MiniLM-L6-v2", device="cpu")
    torch.set_num_threads(before)


def test_replicate_copies_the_module_onto_its_device(model):
    st = model.model
    copy_ = replicate(st, "cpu")
    assert copy_ is not st and copy_[0] is not st[0]
    params = dict(st.named_parameters())
    for name, p in copy_.named_parameters():  # the same device: the copy shares the tensors, never duplicates them
        assert p.data_ptr() == params[name].data_ptr() and p.device == params[name].device
    with torch.inference_mode():
        a = copy_.encode(TEXTS[:4], convert_to_numpy=True)
        b = st.encode(TEXTS[:4], convert_to_numpy=True)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("devices, chunked", [(["cpu", "cpu"], False), (["cpu", "cpu", "cpu"], True)],
                         ids=["2-devices-records", "3-devices-chunks"])
def test_encoder_on_several_devices_gives_one_devices_rows(model, devices, chunked):
    """The same rows, in the same order, vectors at cosine >= 0.9999 (the batches are the same: equal here),
    and every replica ran some of the 9+ model batches of each of two read batches."""
    texts = [f"{i}: {t}" for i, t in enumerate(TEXTS)]
    opts = dict(prompt="passage: ", chunking=TokenChunks(max_tokens=96, overlap=8) if chunked else None,
                tokenizer_threads=2, cpu_share=False)
    with Encoder(model.model, 4, **opts) as one:
        assert one.devices == ["cpu"] and one._replicas is None  # the single-device path
        ref = [one.encode(texts[:20]), one.encode(texts[20:])]
    with Encoder(model.model, 4, devices=devices, **opts) as many:
        assert many.devices == devices and many._replicas is not None
        got = [pending.result() for _, pending in many.encode_stream([texts[:20], texts[20:]], texts=lambda t: t)]
        batches = many.device_batches
    assert len(batches) == len(devices) and all(b >= 1 for b in batches), batches
    for r, g in zip(ref, got):
        assert g.vectors.shape == r.vectors.shape and g.vectors.dtype == r.vectors.dtype
        assert float(cosines(g.vectors, r.vectors).min()) >= 0.9999
        np.testing.assert_allclose(g.vectors, r.vectors, atol=1e-6)
        for k in ("tokens", "record_index", "chunk_index", "char_start", "char_end", "record_tokens", "covered_tokens"):
            np.testing.assert_array_equal(getattr(g, k), getattr(r, k), err_msg=k)
        assert g.truncated_rows == r.truncated_rows
    if chunked:
        assert len(got[0].vectors) > 20  # the long texts gave several windows each


def test_encoder_rejects_bad_devices(model):
    with pytest.raises(ValueError, match="empty list"):
        Encoder(model.model, 4, devices=[], cpu_share=False)
    with pytest.raises(ValueError, match="'gpu0'"):
        Encoder(model.model, 4, devices=["gpu0"], cpu_share=False)
    with Encoder(model.model, 4, devices=["cpu"], cpu_share=False) as enc:  # its own device alone: one device
        assert enc._replicas is None and enc.devices == ["cpu"]


def _asset(root, **kw):
    from dagster_gpu import CorpusSource, TextFormat, embedding_asset

    return embedding_asset(name="emb", corpus=CorpusSource(url=str(root / "corpus"), text_format=TextFormat()),
                           output_url=str(root / "out"), model="all-MiniLM-L6-v2", device="cpu", batch_size=4, **kw)


def _materialize(instance, root, asset) -> tuple[dict, list]:
    assert dg.materialize([asset], instance=instance, partition_key="lines.jsonl").success
    mat = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset.key), limit=1).records[0]
    md = {k: getattr(v, "value", v) for k, v in mat.asset_materialization.metadata.items()}
    t = pq.read_table(root / "out" / "emb" / "lines.jsonl.parquet")
    return md, list(zip(t.column("doc_id").to_pylist(), t.column("vector").to_pylist()))


def test_the_unit_embeds_on_every_device_and_says_so(tmp_path, monkeypatch):
    """The unit on one CPU, then on two "devices" (the device list the worker sees replaced by two CPUs): the
    same rows and vectors, and the materialization names the devices."""
    import dagster_gpu.worker.unit as unit

    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "lines.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in TEXTS[:24]))
    seen = []
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("emb_files", ["lines.jsonl"])
        md1, rows1 = _materialize(instance, tmp_path, _asset(tmp_path))
        assert md1["embedding/devices"] == "1" and md1["embedding/device_names"] == "cpu"
        monkeypatch.setattr(unit, "unit_devices", lambda device: seen.append(device) or ["cpu", "cpu"])
        md2, rows2 = _materialize(instance, tmp_path, _asset(tmp_path, reuse=False))
    assert seen == ["cpu"]
    assert md2["embedding/devices"] == "2" and md2["embedding/device_names"] == "cpu, cpu"
    assert md2["embedding/rows"] == md1["embedding/rows"] == 24 and md2["embedding/reused_rows"] == 0
    assert [d for d, _ in rows2] == [d for d, _ in rows1]
    a, b = np.array([v for _, v in rows1]), np.array([v for _, v in rows2])
    assert float(cosines(a, b).min()) >= 0.9999
