"""Which Slurm cluster the demo's ``--slurm-version`` picks, and how its environment reaches the executor's
config and the browse script (pipelines/demo.py, pipelines/demo_backends.py). Pure plumbing: no service is
started, no demo runs. The 24.11 environment is the one ``resources/slurm/trixie.sh env`` prints
(``printf 'export SLURM_CONF=%q PATH=%q DAGSTER_GPU_SLURM_WORKER_PYTHON=%q'``, read here from the script)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pipelines import demo, demo_backends
from pipelines.demo_backends import browse_script, executor_config, slurm_script

REPO = Path(__file__).resolve().parents[1]


def test_each_slurm_version_names_an_existing_cluster_script_and_the_default_is_unchanged():
    assert slurm_script() == "resources/slurm/cluster.sh" == slurm_script("22.05")
    assert slurm_script("24.11") == "resources/slurm/trixie.sh"
    for script in demo_backends.SLURM_SCRIPTS.values():
        assert (REPO / script).is_file(), script
    with pytest.raises(ValueError, match=r"'23.02'.*22.05, 24.11"):
        slurm_script("23.02")


def test_the_24_11_env_line_parses_into_the_worker_python_the_executor_config_gets(tmp_path):
    """The 24.11 script's own ``env`` line, rendered by bash's printf with the script's format, parsed as the
    demo parses it; the worker interpreter goes to the slurm section only (pods keep the image's python)."""
    fmt = next(line for line in (REPO / "resources/slurm/trixie.sh").read_text().splitlines()
               if "DAGSTER_GPU_SLURM_WORKER_PYTHON=%q" in line).split("'")[1]
    d = "/tmp/dagster-gpu-slurm-2411"
    line = subprocess.run(["bash", "-c", f'printf "$0" {d}/etc/slurm.conf {d}/bin:/usr/bin {d}/bin/worker-python '
                           'http://127.0.0.1:6820', fmt], capture_output=True, text=True, check=True).stdout
    env = demo_backends._exports(line)
    assert env == {"SLURM_CONF": f"{d}/etc/slurm.conf", "PATH": f"{d}/bin:/usr/bin",
                   demo_backends.WORKER_PYTHON_ENV: f"{d}/bin/worker-python",
                   "DAGSTER_GPU_SLURMRESTD_URL": "http://127.0.0.1:6820"}
    py = env[demo_backends.WORKER_PYTHON_ENV]
    cfg = executor_config("auto", tmp_path, py)
    assert cfg["slurm"] == {"account": "research", "spool_dir": str(tmp_path / "slurm-spool"), "python": py, "worker_python": py}
    assert "worker_python" not in cfg and "worker_python" not in cfg["kubernetes"]
    assert executor_config("slurm", tmp_path)["slurm"] == {"account": "research", "spool_dir": str(tmp_path / "slurm-spool")}
    assert "slurm" not in executor_config("kubernetes", tmp_path, py)


def test_the_rest_transport_config_names_the_token_and_secrets_files_and_no_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_GPU_SLURMRESTD_URL", "http://127.0.0.1:6820")
    cfg = executor_config("slurm", tmp_path, "/py", "rest")["slurm"]
    assert cfg["transport"] == "rest" and cfg["rest"]["url"] == "http://127.0.0.1:6820" and cfg["rest"]["user"] == "root"
    assert cfg["rest"]["token_file"] == str(tmp_path / "slurmrestd.jwt")
    assert cfg["env_files"] == [str(tmp_path / "worker-secrets.env")] and "PATH" in cfg["rest"]["forward_env"]
    assert cfg["python"] == "/py" and "ssh" not in cfg
    # the settings it makes are valid gpu_executor settings and build a rest client
    from dagster_gpu.slurm.backend import SlurmBackend, SlurmSettings
    from dagster_gpu.slurm.rest import RestSlurmClient

    settings = SlurmSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()})
    client = SlurmBackend(settings).client
    assert isinstance(client, RestSlurmClient) and client.transport.kind == "rest" and client.transport.remote_spool is None
    assert client.tokens.file == str(tmp_path / "slurmrestd.jwt") and client.user == "root"


def test_the_browse_script_evals_the_chosen_clusters_env(tmp_path):
    text = browse_script("auto", tmp_path, REPO, "24.11").read_text()
    assert 'eval "$(bash resources/slurm/trixie.sh env)"' in text and "cluster.sh" not in text
    text = browse_script("slurm", tmp_path, REPO).read_text()
    assert 'eval "$(bash resources/slurm/cluster.sh env)"' in text and "trixie.sh" not in text
    assert "slurm/" not in browse_script("kubernetes", tmp_path, REPO, "24.11").read_text()
    p = subprocess.run(["bash", "-n", str(tmp_path / "dagster-dev.sh")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_default_homes_keep_each_slurm_versions_runs_apart():
    assert demo.default_home("slurm") == ".dagster_home_slurm" == demo.default_home("slurm", "22.05")
    assert demo.default_home("auto", "24.11") == ".dagster_home_auto-24.11"
    assert demo.default_home("kubernetes", "24.11") == ".dagster_home_kubernetes"
    assert demo.default_home("local", "24.11") == ".dagster_home"


def test_an_unknown_slurm_version_is_refused_by_the_option(capsys):
    with pytest.raises(SystemExit) as e:
        demo.main(["--backend", "slurm", "--slurm-version", "23.02"])
    assert e.value.code == 2 and "invalid choice: '23.02'" in capsys.readouterr().err


def test_events_relay_gives_each_launch_a_channel_in_the_spool_named_by_digest(tmp_path):
    from dagster_gpu.contracts import StepLaunch
    from dagster_gpu.core.request import GpuRequest
    from dagster_gpu.policy.placement import Placement
    from dagster_gpu.slurm.backend import SlurmBackend, SlurmSettings

    cfg = executor_config("slurm", tmp_path, "/py", events="relay")["slurm"]
    assert cfg["events"] == "relay" and "events" not in executor_config("slurm", tmp_path, "/py")["slurm"]
    backend = SlurmBackend(SlurmSettings(**cfg))
    launch = StepLaunch(run_id="r-1", step_key="emb; rm -rf /", partition_keys=("k",), attempt=1, argv=("py",), env={},
                        request=GpuRequest(), placement=Placement(backend="slurm", reason="test"))
    channel = backend.relay_channel(launch)
    root = str(tmp_path / "slurm-spool")
    import re

    assert channel.startswith(f"{root}/relay/r-1/") and re.fullmatch(r"[0-9a-f]{20}\.jsonl", os.path.basename(channel))
    # another attempt or a relaunch after a preemption writes another channel
    import dataclasses

    assert backend.relay_channel(dataclasses.replace(launch, attempt=2)) != channel
    assert backend.relay_channel(dataclasses.replace(launch, preemptions=1)) != channel
    assert backend.read_channel(channel, 0) == b""
    os.makedirs(os.path.dirname(channel))
    with open(channel, "wb") as f:
        f.write(b"0123456789")
    assert backend.read_channel(channel, 4) == b"456789"
    assert SlurmBackend(SlurmSettings(**executor_config("slurm", tmp_path, "/py")["slurm"])).relay_channel(launch) is None
    with pytest.raises(ValueError, match="slurm.events: 'sideways'"):
        SlurmSettings(events="sideways")


def test_the_ssh_transport_config_names_the_clusters_slurm_conf_for_the_login_nodes_shell(tmp_path, monkeypatch):
    """A command run over ssh gets the login node's environment, not the Dagster host's: without ``slurm_conf``
    the demo's sinfo on the login node failed "Could not establish a configuration source"."""
    monkeypatch.setenv("SLURM_CONF", "/tmp/dagster-gpu-slurm/etc/slurm.conf")
    for k, v in {"HOST": "127.0.0.1", "PORT": "22022", "USER": "root", "KEY": str(tmp_path / "key"),
                 "KNOWN_HOSTS": str(tmp_path / "known_hosts")}.items():  # what resources/ssh/sshd.sh env exports
        monkeypatch.setenv(f"DAGSTER_GPU_SSH_{k}", v)
    cfg = executor_config("slurm", tmp_path, None, "ssh")["slurm"]
    assert cfg["transport"] == "ssh" and cfg["slurm_conf"] == "/tmp/dagster-gpu-slurm/etc/slurm.conf"
    assert "slurm_conf" not in executor_config("slurm", tmp_path)["slurm"]


def test_the_demos_summary_says_which_transport_reached_slurm():
    assert demo.target("slurm", "22.05", "ssh") == "slurm (Slurm 22.05, over ssh to the login node)"
    assert demo.target("auto", "24.11", "rest") == "auto (Slurm 24.11, through slurmrestd)"
    assert demo.target("slurm", "22.05", "local") == "slurm (Slurm 22.05, slurm commands on this host)"
    assert demo.target("kubernetes", "22.05", "local") == "kubernetes"
