"""The relay channel on an object store (``slurm.relay_url``): parts written by a real writer to moto's S3 server
(tests/s3_helpers.py, the session's ``s3`` fixture) and read back as one channel.

Real Dagster where events matter (a real in-process materialization against the relay's ephemeral instance,
stored by :class:`RelayPump` into a real SQLite instance); a writer killed mid-flight is a real SIGKILL of a
process uploading parts; a listing that lags is a part put out of order with boto3.
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import subprocess
import sys
import time
import uuid

import dagster as dg
import pytest
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.dagster_run import DagsterRun

from dagster_gpu.contracts import StepLaunch
from dagster_gpu.core.request import GpuRequest
from dagster_gpu.relay.pump import RelayPump, refusal
from dagster_gpu.relay.channel import RELAY_ENV, decode, encode, relay_env
from dagster_gpu.relay.objects import (
    ObjectChannelWriter, channel_reader, open_channel_writer, outcome_in_any_channel, read_object_channel,
)
from dagster_gpu.relay.parts import (
    check_relay_settings, is_object_channel, next_sequence, part_name, part_sequence, parts_to_read,
)
from dagster_gpu.relay.storage import RelaySeed, relay_instance
from dagster_gpu.policy.placement import Placement
from dagster_gpu.slurm.backend import SlurmBackend, SlurmSettings
from dagster_gpu.slurm.client import SlurmClient
from dagster_gpu.slurm.requeue import prepare_requeued_attempt
from tests.test_relay import _copy_run, _records, relayed

BUCKET = "relay-objects"


@pytest.fixture
def store(s3):
    """(channel URL under a fresh prefix, storage options, boto3 client) on the session's moto server."""
    s3.bucket(BUCKET)
    return f"s3://{BUCKET}/relay/{uuid.uuid4().hex}", {"client_kwargs": {"endpoint_url": s3.endpoint}}, s3.client


@pytest.fixture
def real(tmp_path):
    (tmp_path / "home").mkdir()
    with dg.DagsterInstance.local_temp(str(tmp_path / "home")) as inst:
        yield inst


def _entry(i: int, pad: int = 0) -> EventLogEntry:
    return EventLogEntry(error_info=None, level="INFO", user_message=f"{i} " + "x" * pad, run_id="r",
                         timestamp=1_700_000_000.0 + i, step_key="s", job_name="j", dagster_event=None)


def _parts(client, url: str) -> dict[str, int]:
    prefix = url.split("://", 1)[1].split("/", 1)[1] + "/"
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return {o["Key"][len(prefix):]: o["Size"] for o in listed}


# -- the pure rules ---------------------------------------------------------------------------------------


def test_part_names_sequence_continuation_and_the_offset_to_part_mapping():
    assert part_name(1) == "00000001.jsonl" and part_name(12345678) == "12345678.jsonl"
    with pytest.raises(ValueError, match="part number 0"):
        part_name(0)
    assert part_sequence("bucket/p/00000042.jsonl") == 42 and part_sequence("00000000.jsonl") is None
    assert part_sequence("p/42.jsonl") is None and part_sequence("p/00000001.jsonl.tmp") is None
    assert next_sequence([]) == 1 and next_sequence(["a/00000003.jsonl", "a/00000001.jsonl", "a/junk"]) == 4
    sizes = {1: 10, 2: 5, 3: 7}
    assert parts_to_read(sizes, 0) == [(1, 0), (2, 0), (3, 0)]
    assert parts_to_read(sizes, 10) == [(2, 0), (3, 0)]  # a whole part below the offset is skipped
    assert parts_to_read(sizes, 12) == [(2, 2), (3, 0)]
    assert parts_to_read(sizes, 22) == [] and parts_to_read(sizes, 99) == []
    assert parts_to_read({1: 10, 3: 7}, 0) == [(1, 0)]  # stop at the gap: part 3 waits for part 2
    assert parts_to_read({2: 5}, 0) == []
    with pytest.raises(ValueError, match="offset -1"):
        parts_to_read(sizes, -1)
    assert is_object_channel("s3://b/p") and not is_object_channel("/spool/relay/r/x.jsonl")


def test_relay_settings_refuse_a_credential_a_path_or_a_url_without_relay():
    check_relay_settings("relay", "s3://b/p", {"client_kwargs": {"endpoint_url": "http://x"}})
    with pytest.raises(ValueError, match=r"slurm.relay_storage_options.client_kwargs.aws_secret_access_key"):
        check_relay_settings("relay", "s3://b/p", {"client_kwargs": {"aws_secret_access_key": "s"}})
    with pytest.raises(ValueError, match=r"slurm.relay_storage_options.key, .*relay_storage_options.secret"):
        check_relay_settings("relay", "s3://b/p", {"key": "k", "secret": "s"})
    with pytest.raises(ValueError, match="slurm.relay_url is set but slurm.events is 'direct'"):
        SlurmSettings(relay_url="s3://b/p")
    with pytest.raises(ValueError, match=r"slurm.relay_url: '/shared/relay' is not an object-store URL"):
        SlurmSettings(events="relay", relay_url="/shared/relay")
    with pytest.raises(ValueError, match=r"slurm.relay_url: 's3://' is not"):
        SlurmSettings(events="relay", relay_url="s3://")
    with pytest.raises(ValueError, match="relay_storage_options is set without slurm.relay_url"):
        SlurmSettings(events="relay", relay_storage_options={"anon": True})


# -- writer and reader through moto ---------------------------------------------------------------------


def test_events_round_trip_through_parts_and_offsets_work_across_parts(store):
    url, opts, client = store
    w = ObjectChannelWriter(url, opts, flush_interval_s=60.0)  # only explicit flushes: parts of known content
    for batch in ([0, 1], [2], [3, 4, 5]):
        for i in batch:
            w.write_event(_entry(i))
        w.flush()
    w.close()  # nothing left: no empty part
    parts = _parts(client, url)
    assert sorted(parts) == ["00000001.jsonl", "00000002.jsonl", "00000003.jsonl"]
    whole = read_object_channel(url, 0, opts)
    assert len(whole) == sum(parts.values())
    d = decode(whole)
    assert [e.user_message for e in d.events] == [f"{i} " for i in range(6)] and d.consumed == len(whole) and not d.bad_lines
    # every offset, at part boundaries and inside parts, reads the channel's bytes from there
    for offset in (0, parts["00000001.jsonl"], parts["00000001.jsonl"] + 7, len(whole) - 1, len(whole), len(whole) + 5):
        assert read_object_channel(url, offset, opts) == whole[offset:]
    assert read_object_channel(f"s3://{BUCKET}/relay/absent", 0, opts) == b""


@pytest.mark.exclusive  # each record readable within 1 s
def test_a_record_is_in_the_store_within_the_flush_interval(store):
    url, opts, _ = store
    w = ObjectChannelWriter(url, opts)  # the default interval, from the uploader thread
    try:
        waits = []
        for i in range(5):
            t0 = time.monotonic()
            w.write_event(_entry(i))
            while len(decode(read_object_channel(url, 0, opts)).events) < i + 1:
                assert time.monotonic() - t0 < 1.0, f"record {i} not readable 1 s after it was written"
                time.sleep(0.02)
            waits.append(time.monotonic() - t0)
        assert max(waits) < 1.0, waits
    finally:
        w.close()


def test_a_gap_in_the_listing_stops_the_reader_until_the_part_shows(store):
    url, opts, client = store
    prefix = url.split("://", 1)[1].split("/", 1)[1]
    one, two, three = encode({"n": 1}), encode({"n": 2}), encode({"n": 3})
    client.put_object(Bucket=BUCKET, Key=f"{prefix}/00000001.jsonl", Body=one)
    client.put_object(Bucket=BUCKET, Key=f"{prefix}/00000003.jsonl", Body=three)
    assert read_object_channel(url, 0, opts) == one  # part 3 is not read past the missing part 2
    assert read_object_channel(url, len(one), opts) == b""
    client.put_object(Bucket=BUCKET, Key=f"{prefix}/00000002.jsonl", Body=two)
    assert read_object_channel(url, len(one), opts) == two + three


def test_a_requeued_tasks_writer_continues_after_the_earlier_attempts_parts(store):
    url, opts, client = store
    first = ObjectChannelWriter(url, opts, flush_interval_s=60.0)
    assert first.next_part == 1
    for i in range(3):
        first.write_event(_entry(i))
        first.flush()
    first.close()
    second = open_channel_writer(url, opts)  # a requeued array task opening the same channel
    assert isinstance(second, ObjectChannelWriter) and second.next_part == 4
    second.write_event(_entry(3))
    second.close()
    assert sorted(_parts(client, url)) == [part_name(i) for i in range(1, 5)]
    assert [e.user_message for e in decode(read_object_channel(url, 0, opts)).events] == [f"{i} " for i in range(4)]


def _relayed_run_to(url: str, opts, partition: str = "a") -> str:
    """Materialize ``relayed``'s ``partition`` in process against a relay instance writing to the object channel
    ``url``; returns the run id."""
    writer = ObjectChannelWriter(url, opts)
    inst = relay_instance(RelaySeed(run=DagsterRun(job_name="__seed__", run_id=str(uuid.uuid4()))), writer)
    result = dg.materialize([relayed], instance=inst, partition_key=partition)
    writer.close()
    assert result.success
    return result.run_id


def test_a_resumed_run_worker_reading_from_mid_channel_stores_each_event_once(store, real):
    url, opts, client = store
    run_id = _relayed_run_to(url, opts)
    assert len(_parts(client, url)) >= 1
    everything = decode(read_object_channel(url, 0, opts))
    step = next(e.step_key for e in everything.events if e.step_key)
    _copy_run(url, run_id, real)
    first = RelayPump()
    first.watch(url, run_id, step, channel_reader(opts))
    storable = [e for e in everything.events if refusal(e, run_id, step) is None]  # not the run-level events
    assert first.pump(real, run_id) == len(storable) >= 8
    # a resumed run worker: a new pump, reading the whole channel again, and one that starts mid-channel
    again = RelayPump()
    again.watch(url, run_id, step, channel_reader(opts))
    assert again.pump(real, run_id) == 0
    mid = RelayPump()
    mid.watch(url, run_id, step, channel_reader(opts))
    mid._channels[url].offset = len(read_object_channel(url, 0, opts)) // 2
    mid._channels[url].offset = decode(read_object_channel(url, 0, opts)[: mid._channels[url].offset]).consumed
    assert mid.pump(real, run_id) == 0
    mats = real.fetch_materializations(dg.AssetRecordsFilter(asset_key=relayed.key, asset_partitions=["a"]), limit=5).records
    assert len(mats) == 1 and mats[0].event_log_entry.asset_materialization.metadata["test/partition_key"].value == "a"
    relayed_here = [r for r in _records(real, run_id) if "dagster-gpu relay: stored" not in (r.event_log_entry.message or "")]
    assert len(relayed_here) == len(storable)


def test_outcome_in_a_url_channel_for_the_requeue_check(store, tmp_path):
    url, opts, _ = store
    run_id = _relayed_run_to(url, opts)
    step = next(e.step_key for e in decode(read_object_channel(url, 0, opts)).events if e.step_key)
    assert outcome_in_any_channel(url, {step}, opts)
    assert not outcome_in_any_channel(url, {"another_step"}, opts)
    assert not outcome_in_any_channel(f"{url}-absent", {step}, opts)
    # what a requeued array task runs first reads the storage options from its relay environment
    from dagster_gpu.instance.step_args import ENV_VAR, encode_step_args
    from dagster._grpc.types import ExecuteStepArgs
    from tests.test_compat_paths import noop_job

    args = ExecuteStepArgs(job_origin=dg.reconstructable(noop_job).get_python_origin(), run_id=run_id, step_keys_to_execute=[step], instance_ref=None)
    env = {ENV_VAR: encode_step_args(args), RELAY_ENV: relay_env(url, "seed", opts)}
    assert json.loads(env[RELAY_ENV])["storage_options"] == opts
    assert prepare_requeued_attempt(env, step) is False
    env[RELAY_ENV] = relay_env(f"{url}-absent", "seed", opts)
    assert prepare_requeued_attempt(env, step) is True


WRITER = r"""
import json, sys, time
from dagster._core.events.log import EventLogEntry
from dagster_gpu.relay.objects import ObjectChannelWriter
w = ObjectChannelWriter(sys.argv[1], json.loads(sys.argv[2]), flush_interval_s=0.01)
print("ready", w.next_part, flush=True)
i = 0
while True:
    w.write_event(EventLogEntry(error_info=None, level="INFO", user_message=f"{i} " + "x" * 100_000, run_id="r",
                                timestamp=time.time(), step_key="s", job_name="j", dagster_event=None))
    i += 1
    time.sleep(0.002)
"""


def test_a_writer_sigkilled_mid_flight_leaves_only_whole_parts(store):
    url, opts, client = store
    firsts = []
    for delay in (0.4, 0.9, 1.5):
        p = subprocess.Popen([sys.executable, "-c", WRITER, url, json.dumps(opts)], stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline().split()
        assert line[0] == "ready", line
        firsts.append(int(line[1]))
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
    parts = _parts(client, url)
    seqs = sorted(part_sequence(n) for n in parts)
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 3, parts  # no gap, no foreign object
    assert firsts[0] == 1 and firsts[1] > 1 and firsts[2] > firsts[1]  # each attempt after the earlier's parts
    whole = read_object_channel(url, 0, opts)
    d = decode(whole)
    assert d.consumed == len(whole) and not d.bad_lines  # no torn record anywhere
    assert all(e.user_message.endswith("x" * 100_000) for e in d.events)
    # each attempt's records are in its order, starting at 0
    numbers = [int(e.user_message.split()[0]) for e in d.events]
    assert numbers[0] == 0 and sum(1 for n in numbers if n == 0) <= 3


# -- the Slurm backend ----------------------------------------------------------------------------------


def test_the_slurm_backend_names_and_reads_object_channels_with_relay_url(store, tmp_path):
    url, opts, client = store
    backend = SlurmBackend(SlurmSettings(spool_dir=str(tmp_path / "spool"), events="relay", relay_url=url + "/",
                                         relay_storage_options=opts), client=SlurmClient())
    launch = StepLaunch(run_id="r-1", step_key="emb; rm -rf /", partition_keys=("k",), attempt=1, argv=("py",), env={},
                        request=GpuRequest(), placement=Placement(backend="slurm", reason="test"))
    channel = backend.relay_channel(launch)
    assert re.fullmatch(re.escape(url) + r"/r-1/[0-9a-f]{20}", channel), channel
    assert backend.relay_channel(dataclasses.replace(launch, attempt=2)) != channel
    assert backend.relay_storage_options() == opts
    assert backend.read_channel(channel, 0) == b""
    w = open_channel_writer(channel, backend.relay_storage_options())
    w.write_record(b'{"a":1}\n')
    w.close()
    assert backend.read_channel(channel, 0) == b'{"a":1}\n' and backend.read_channel(channel, 3) == b'":1}\n'
    assert list(_parts(client, channel)) == ["00000001.jsonl"]
    assert not (tmp_path / "spool" / "relay").exists()
    spooled = SlurmBackend(SlurmSettings(spool_dir=str(tmp_path / "spool2"), events="relay"), client=SlurmClient())
    assert spooled.relay_storage_options() == {} and spooled.relay_channel(launch).endswith(".jsonl")


PREEMPTED = r"""
import json, sys, time
from dagster._core.events.log import EventLogEntry
from dagster_gpu.relay.objects import ObjectChannelWriter
from dagster_gpu.worker.preemption import before_exit_preempted, exit_preempted
w = ObjectChannelWriter(sys.argv[1], json.loads(sys.argv[2]), flush_interval_s=3600.0)  # nothing uploads by itself
before_exit_preempted(w.close)  # as relay_step registers it
for i in range(3):
    w.write_event(EventLogEntry(error_info=None, level="INFO", user_message=f"{i} before the stop", run_id="r",
                                timestamp=time.time(), step_key="s", job_name="j", dagster_event=None))
exit_preempted()  # a graceful stop: os._exit, no finally
"""


def test_a_graceful_stop_uploads_what_the_writer_still_buffers(store):
    url, opts, client = store
    p = subprocess.run([sys.executable, "-c", PREEMPTED, url, json.dumps(opts)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 143, p.stderr
    assert list(_parts(client, url)) == ["00000001.jsonl"]
    assert [e.user_message for e in decode(read_object_channel(url, 0, opts)).events] == [
        f"{i} before the stop" for i in range(3)]


def test_a_last_upload_that_fails_is_an_error_naming_the_channel(s3):
    opts = {"client_kwargs": {"endpoint_url": s3.endpoint}}
    url = f"s3://relay-no-such-bucket-{uuid.uuid4().hex[:8]}/r/c"
    w = ObjectChannelWriter(url, opts, flush_interval_s=3600.0)
    w.write_record(b'{"a":1}\n')
    with pytest.raises(OSError, match=rf"relay channel {re.escape(url)}: could not upload the last records"):
        w.close()
    with pytest.raises(ValueError, match="one line ending in"):
        w.write_record(b'{"a":1}')
