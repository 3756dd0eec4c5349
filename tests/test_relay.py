"""The relay (``events: relay``): a step worker's events reach the instance through a channel file, exactly once.

Real Dagster throughout: the events are those of a real in-process materialization (``dagster.materialize`` against
the relay's ephemeral instance: step start, a partition's materialization with metadata, its asset check
evaluation, log lines, step success), stored by :class:`RelayPump` into a real SQLite instance. A run worker's
restart is a new pump over the same channel; a worker killed mid-write is a real SIGKILL of a process writing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import dagster as dg
import pytest
from dagster._core.storage.dagster_run import DagsterRun

from dagster_gpu.relay.pump import RelayPump, quantile, refusal, rewrite, stored_keys
from dagster_gpu.relay.channel import ChannelWriter, decode, event_key, outcome_in_channel, read_from
from dagster_gpu.relay.storage import (
    MAX_SEED_BYTES, RelaySeed, RelaySeedTooLarge, decode_seed, relay_instance, seed_for,
)

parts = dg.StaticPartitionsDefinition(["a", "b"])


@dg.asset(partitions_def=parts, check_specs=[dg.AssetCheckSpec("rows_positive", asset="relayed")])
def relayed(context):
    context.log.info(f"embedding {context.partition_key}")
    yield dg.MaterializeResult(metadata={"billing/cost_usd": 0.25, "test/partition_key": context.partition_key},
                               check_results=[dg.AssetCheckResult(passed=True, check_name="rows_positive")])



def _relayed_run(tmp_path, partition: str = "a") -> tuple[str, str]:
    """Materialize ``relayed``'s ``partition`` in process against a relay instance; returns (channel, run id)."""
    channel = str(tmp_path / "spool" / "relay" / f"{uuid.uuid4().hex}.jsonl")
    writer = ChannelWriter(channel)
    seed = RelaySeed(run=DagsterRun(job_name="__seed__", run_id=str(uuid.uuid4())))
    inst = relay_instance(seed, writer)
    result = dg.materialize([relayed], instance=inst, partition_key=partition)
    writer.close()
    assert result.success
    return channel, result.run_id


@pytest.fixture
def real(tmp_path):
    (tmp_path / "home").mkdir()
    with dg.DagsterInstance.local_temp(str(tmp_path / "home")) as inst:
        yield inst


def _copy_run(src_channel: str, run_id: str, real) -> None:
    """The run, as the real instance holds it before its worker starts (its run worker created it)."""
    real.add_run(DagsterRun(job_name="__ASSET_JOB", run_id=run_id, status=dg.DagsterRunStatus.STARTED))


def _records(real, run_id):
    return real.get_records_for_run(run_id).records


def test_channel_holds_every_event_the_worker_stored_and_the_pump_stores_them_once(tmp_path, real):
    channel, run_id = _relayed_run(tmp_path)
    assert oct(os.stat(channel).st_mode & 0o777) == "0o600"
    assert oct(os.stat(os.path.dirname(channel)).st_mode & 0o777) == "0o700"
    decoded = decode(open(channel, "rb").read())
    assert decoded.bad_lines == [] and decoded.consumed == os.path.getsize(channel)
    types = [e.dagster_event.event_type_value if e.dagster_event else "log" for e in decoded.events]
    for t in ("STEP_START", "ASSET_MATERIALIZATION", "ASSET_CHECK_EVALUATION", "STEP_SUCCESS", "PIPELINE_SUCCESS"):
        assert t in types, types
    assert "log" in types  # context.log.info reached the channel too
    _copy_run(channel, run_id, real)
    step = next(e.step_key for e in decoded.events if e.step_key)
    pump = RelayPump()
    pump.watch(channel, run_id, step, read_from)
    stored = pump.pump(real, run_id)
    # everything but the run-level events (materialize() ran a whole run in process; a step worker writes none)
    run_level = [t for t in types if t.startswith("PIPELINE_") or t.endswith("_PLANNED")]
    assert len(run_level) >= 4 and stored == len(decoded.events) - len(run_level)
    assert real.get_run_by_id(run_id).status == dg.DagsterRunStatus.STARTED  # the channel cannot end the run
    mats = real.fetch_materializations(dg.AssetRecordsFilter(asset_key=relayed.key, asset_partitions=["a"]), limit=5).records
    assert len(mats) == 1 and mats[0].run_id == run_id
    assert mats[0].asset_materialization.metadata["test/partition_key"].value == "a"
    # the check evaluation targets the materialization's storage id in the *real* instance
    evals = [r for r in _records(real, run_id)
             if r.event_log_entry.dagster_event and r.event_log_entry.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert len(evals) == 1
    target = evals[0].event_log_entry.dagster_event.event_specific_data.target_materialization_data
    assert target is not None and target.storage_id == mats[0].storage_id and target.run_id == run_id
    # the run's cost tag grew by the relayed materialization's billing/cost_usd
    assert float(real.get_run_by_id(run_id).tags["dagster_gpu/cost_usd"]) == pytest.approx(0.25)
    # the delay of the one materialization, and the engine event saying what was relayed
    assert len(pump.delays(run_id)) == 1 and 0 <= pump.delays(run_id)[0] < 60
    reports = [r for r in _records(real, run_id) if "dagster-gpu relay: stored" in (r.event_log_entry.message or "")]
    assert len(reports) == 1
    md = reports[0].event_log_entry.dagster_event.engine_event_data.metadata
    assert md["dagster_gpu/relay_events"].value == stored and md["dagster_gpu/relay_materializations"].value == 1
    assert md["dagster_gpu/relay_reads"].value == md["dagster_gpu/relay_polls"].value == 1
    # nothing more on the next read
    assert pump.pump(real, run_id, force=True) == 0 and pump.reads(run_id) == 2


def test_a_restarted_run_worker_stores_nothing_twice_and_nothing_is_lost(tmp_path, real):
    channel, run_id = _relayed_run(tmp_path)
    _copy_run(channel, run_id, real)
    data = open(channel, "rb").read()
    step = next(e.step_key for e in decode(data).events if e.step_key)
    # the first run worker read only the first half of the channel, then died (after storing, before anything else)
    half = data[: data.index(b"\n", len(data) // 2) + 1]
    first = RelayPump()
    first.watch(channel, run_id, step, lambda path, offset: half[offset:])
    n_first = first.pump(real, run_id)
    admitted = [e for e in decode(data).events if refusal(e, run_id, step) is None]
    assert 0 < n_first < len(admitted)
    # its successor reads the whole channel from the start
    second = RelayPump()
    second.watch(channel, run_id, step, read_from)
    n_second = second.pump(real, run_id)
    assert n_first + n_second == len(admitted)
    keys = [event_key(r.event_log_entry) for r in _records(real, run_id)
            if "dagster-gpu relay: stored" not in (r.event_log_entry.message or "")]
    assert len(keys) == len(set(keys)) == len(admitted)
    assert stored_keys(real, run_id) >= {event_key(e) for e in admitted}
    mats = real.fetch_materializations(dg.AssetRecordsFilter(asset_key=relayed.key), limit=5).records
    assert len(mats) == 1


def test_a_quiet_channel_is_read_less_often_and_a_busy_one_at_every_poll(tmp_path, real):
    """Reads of a channel that keeps coming back empty (a task still queued) back off to one per 8 s; the first
    bytes bring the gap back under the poll period; ``force`` (the health check) reads whatever the gap."""
    channel, run_id = _relayed_run(tmp_path)
    _copy_run(channel, run_id, real)
    data = open(channel, "rb").read()
    step = next(e.step_key for e in decode(data).events if e.step_key)
    now = [0.0]
    written = [b""]  # what the task has written so far
    reads: list[float] = []

    def read(path: str, offset: int) -> bytes:
        reads.append(now[0])
        return written[0][offset:]

    pump = RelayPump(clock=lambda: now[0])
    pump.watch(channel, run_id, step, read)
    for t in range(0, 30):  # the executor's poll, every second, for 30 s of an empty channel
        now[0] = float(t)
        pump.pump(real, run_id)
    assert reads == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 24.0]  # gaps 0.5 (under the poll), 1, 2, 4, 8, 8 s
    written[0] = data  # the task writes its events
    now[0] = 30.0
    assert pump.pump(real, run_id) == 0  # 32 is the next read
    now[0] = 32.0
    assert pump.pump(real, run_id) > 0 and reads[-1] == 32.0
    now[0] = 33.0
    pump.pump(real, run_id)
    assert reads[-1] == 33.0  # bytes came: read at every poll again
    now[0] = 33.2
    pump.pump(real, run_id, force=True)
    assert reads[-1] == 33.2 and pump.reads(run_id) == len(reads) == 10


def test_a_torn_last_line_is_not_read_until_complete_and_a_new_writer_ends_it(tmp_path):
    channel, _ = _relayed_run(tmp_path)
    whole = decode(open(channel, "rb").read())
    with open(channel, "ab") as f:  # a writer killed mid-line: a fragment without its newline
        f.write(b'{"event":"{\\"__class__\\": \\"EventLogEn')
    partial = decode(open(channel, "rb").read())
    assert len(partial.events) == len(whole.events) and partial.bad_lines == []
    assert partial.consumed == whole.consumed  # the fragment waits
    # the requeued task's writer ends the fragment, then appends its own events
    channel2, _ = channel, None
    writer = ChannelWriter(channel2)
    writer.write_event(whole.events[0])
    writer.close()
    after = decode(open(channel, "rb").read())
    assert len(after.bad_lines) == 1 and len(after.events) == len(whole.events) + 1
    assert event_key(after.events[-1]) == event_key(whole.events[0])


WRITER = r"""
import sys, time
from dagster._core.events.log import EventLogEntry
from dagster_gpu.relay.channel import ChannelWriter
w = ChannelWriter(sys.argv[1])
i = 0
print("ready", flush=True)
while True:
    w.write_event(EventLogEntry(error_info=None, level="INFO", user_message=f"{i} " + "x" * 200_000, run_id="r",
                                timestamp=time.time(), step_key="s", job_name="j", dagster_event=None))
    i += 1
"""


def test_a_writer_sigkilled_at_any_instant_leaves_a_readable_channel(tmp_path):
    channel = str(tmp_path / "relay" / "killed.jsonl")
    for delay in (0.05, 0.13, 0.31):
        p = subprocess.Popen([sys.executable, "-c", WRITER, channel], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
    w = ChannelWriter(channel)  # the next writer, as a requeued task
    from dagster._core.events.log import EventLogEntry

    w.write_event(EventLogEntry(error_info=None, level="INFO", user_message="last", run_id="r", timestamp=time.time(),
                                step_key="s", job_name="j", dagster_event=None))
    w.close()
    d = decode(open(channel, "rb").read())
    assert d.consumed == os.path.getsize(channel)
    assert len(d.bad_lines) <= 3  # at most one torn line per kill
    assert d.events[-1].user_message == "last"
    numbers = [int(e.user_message.split()[0]) for e in d.events[:-1]]
    assert numbers and all(e.user_message.endswith("x" * 100) for e in d.events[:-1])


def test_the_seed_round_trips_and_too_large_a_seed_is_refused(tmp_path, real):
    channel, run_id = _relayed_run(tmp_path)
    _copy_run(channel, run_id, real)
    pump = RelayPump()
    step = next(e.step_key for e in decode(open(channel, "rb").read()).events if e.step_key)
    pump.watch(channel, run_id, step, read_from)
    pump.pump(real, run_id)
    seed = seed_for(real, real.get_run_by_id(run_id), dynamic={"files": ["f1", "f2"]})
    back = decode_seed(seed.encode())
    assert back.run.run_id == run_id and back.done == {"relayed": ["a"]} and back.dynamic == {"files": ["f1", "f2"]}
    # the worker's instance answers what the unit asks it: this run's materializations, the dynamic keys
    inst = relay_instance(back, ChannelWriter(str(tmp_path / "c2.jsonl")))
    from dagster_gpu.worker.unit import already_materialized

    assert already_materialized(inst, run_id, relayed.key) == {"a"}
    assert inst.get_dynamic_partitions("files") == ["f1", "f2"]
    assert os.path.getsize(tmp_path / "c2.jsonl") == 0  # the seed is not relayed back
    big = RelaySeed(run=back.run, dynamic={"files": [uuid.uuid4().hex for _ in range(20_000)]})
    with pytest.raises(RelaySeedTooLarge, match=f"more than the {MAX_SEED_BYTES}"):
        big.encode()
    with pytest.raises(ValueError, match="not base64 of zlib"):
        decode_seed("not a seed")


def test_the_input_event_pointer_is_the_real_instances_latest_observation(tmp_path, real):
    channel, run_id = _relayed_run(tmp_path, "b")
    entry = next(e for e in decode(open(channel, "rb").read()).events
                 if e.dagster_event and e.dagster_event.event_type_value == "ASSET_MATERIALIZATION")
    mat = entry.dagster_event.step_materialization_data.materialization
    tag = "dagster/input_event_pointer/corpus"
    entry = entry._replace(dagster_event=entry.dagster_event._replace(
        event_specific_data=entry.dagster_event.step_materialization_data._replace(
            materialization=mat._replace(tags={**(mat.tags or {}), tag: "NULL"}))))
    real.report_runless_asset_event(dg.AssetObservation(asset_key="corpus", partition="b"))
    latest = real.get_latest_storage_id_by_partition(dg.AssetKey("corpus"), dg.DagsterEventType.ASSET_OBSERVATION, {"b"})["b"]
    out = rewrite(real, entry).dagster_event.step_materialization_data.materialization
    assert out.tags[tag] == str(latest) and out.partition == "b"


def test_a_requeued_task_finds_the_outcome_in_the_channel(tmp_path):
    channel, _ = _relayed_run(tmp_path)
    step = next(e.step_key for e in decode(open(channel, "rb").read()).events if e.step_key)
    assert outcome_in_channel(channel, {step})
    assert not outcome_in_channel(channel, {"another_step"})
    assert not outcome_in_channel(str(tmp_path / "absent.jsonl"), {step})


def test_quantile_is_nearest_rank():
    assert quantile([], 0.5) is None
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([float(i) for i in range(1, 101)], 0.95) == 95.0
