"""The project's shell scripts (scripts/, resources/**/*.sh, .ci/run, bench/*.sh).

Rules checked: no pipeline ends in an early-exiting reader (under ``pipefail`` the writer's SIGPIPE, exit
141, fails the script depending on timing); every entry script sources resources/lib/errtrap.sh, so a
script that stops says which step failed, the command, and where its log is (with the log's tail); and
scripts/test.sh starts every service unconditionally. Then the behaviour: the trap's report, and the
scripts that failed before (build.sh's version lines; a PostgreSQL that cannot start).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from failure_summary import first_error_line
from strict_e2e import SERVICE_MARKERS, services_required

REPO = Path(__file__).resolve().parents[1]
ERRTRAP = REPO / "resources" / "lib" / "errtrap.sh"


def tracked_scripts() -> list[Path]:
    """Every shell script in git (``*.sh`` and ``.ci/run``), errtrap.sh included."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=REPO, capture_output=True, check=True).stdout.decode()  # fmt: skip
    paths = [REPO / p for p in out.split("\0") if p and (p.endswith(".sh") or p == ".ci/run")]
    return sorted(p for p in paths if p.exists())


def entry_scripts() -> list[Path]:
    """Scripts a person or CI runs: scripts/, resources/**/*.sh (not the sourced libraries in resources/lib),
    .ci/run."""
    lib, bench = REPO / "resources" / "lib", REPO / "bench"
    return [p for p in tracked_scripts() if not p.is_relative_to(lib) and not p.is_relative_to(bench)]


# A pipe (not ||) followed by a reader that exits before its input ends.
EARLY_READER = re.compile(
    r"(?<!\|)\|(?!\|)\s*(?:"
    r"head\b|"  # head -1, head -n1, head -c
    r"grep\b[^|]*?\s(?:-[a-zA-Z]*[qml]|--quiet|--silent|--max-count|--files-with(?:out)?-match)|"
    r"sed\b[^|]*(?:\bq\b|\dq\b|/q\b)|"  # sed 1q, sed -n '/x/{p;q}'
    r"awk\b[^|]*\bexit\b|"
    r"read\b"  # `| read x` exits after one line
    r")"
)


def code_lines(path: Path):
    """(line number, text) of a script with whole-line comments removed."""
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        yield i, line


@pytest.mark.parametrize(
    "line, bad",
    [
        ('"$BIN/etcd" --version 2>&1 | head -1 >&2', True),
        ("sinfo -o %T | head -n1", True),
        ("scontrol ping | grep -q 'is UP'", True),
        ("sacctmgr show qos | grep -qx high", True),
        ("cmd | grep -m1 x", True),
        ("cmd | grep --quiet x", True),
        ("cmd | sed -n 1q", True),
        ("cmd | awk '/x/ {print; exit}'", True),
        ("cmd | read first", True),
        ("ls -d /x | sort -V | tail -n 1", False),
        ("grep -q x <<<\"$(cmd)\"", False),
        ("head -c 24 /dev/urandom | base64 | tr -dc A-Z", False),
        ("cmd || head -1 file", False),
        ("cmd | grep -v x | wc -l", False),
        ("cmd | grep -E 'html|xml' | sort", False),
        ("cmd | awk '{print $2}'", False),
    ],
)
def test_early_reader_pattern(line, bad):
    assert bool(EARLY_READER.search(line)) is bad


def test_no_script_pipes_into_an_early_exiting_reader():
    found = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in tracked_scripts() for i, line in code_lines(p)
             if EARLY_READER.search(line)]  # fmt: skip
    assert len(tracked_scripts()) >= 9  # the set this test covers did not silently shrink
    assert found == []


def test_every_entry_script_sources_errtrap():
    missing = []
    for p in entry_scripts():
        head = p.read_text().splitlines()[:40]
        src = [ln for ln in head if re.match(r'\s*source\s+"\$\(dirname "\$\{BASH_SOURCE\[0\]\}"\)/.*lib/errtrap\.sh"', ln)]
        if len(src) != 1:
            missing.append(str(p.relative_to(REPO)))
        else:
            rel = src[0].split(')/', 1)[1].rstrip('"')
            assert (p.parent / rel).resolve() == ERRTRAP, p
    assert missing == []
    names = {str(p.relative_to(REPO)) for p in entry_scripts()}
    assert {"scripts/test.sh", "scripts/setup.sh", "scripts/demo.sh", ".ci/run", "resources/k8s/build.sh",
            "resources/k8s/cluster.sh", "resources/slurm/cluster.sh", "resources/postgres/postgres.sh"} <= names


def test_every_script_parses():
    for p in tracked_scripts():
        cp = subprocess.run(["bash", "-n", str(p)], capture_output=True, text=True)
        assert cp.returncode == 0, f"{p}: {cp.stderr}"


def test_test_sh_starts_every_service_unconditionally():
    text = (REPO / "scripts" / "test.sh").read_text()
    lines = [ln for _, ln in code_lines(REPO / "scripts" / "test.sh")]
    for cmd in ("bash resources/postgres/postgres.sh start", "bash resources/slurm/cluster.sh start",
                "bash resources/k8s/cluster.sh start"):  # fmt: skip
        assert cmd in lines, f"scripts/test.sh must run `{cmd}` on a line of its own (no guard)"
    # the Go build runs in the background from the start; its exit status is waited for (a failure stops the script)
    assert 'bash resources/k8s/build.sh >"$K8S_BUILD_LOG" 2>&1 &' in lines
    assert 'wait "$K8S_BUILD_PID"' in lines
    assert lines.index('wait "$K8S_BUILD_PID"') < lines.index("bash resources/k8s/cluster.sh start")
    assert not re.search(r"\bif\b|\|\|\s*true|&&", "\n".join(ln for ln in lines if "resources/" in ln))
    assert "DAGSTER_GPU_REQUIRE_SERVICES=1" in text


# ------------------------------------------------------------------------------------------ behaviour
def run_bash(script: str, tmp_path: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    path = tmp_path / "s.sh"
    path.write_text(f'source "{ERRTRAP}"\n' + script)
    return subprocess.run(["bash", str(path)], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=60)


def test_trap_names_step_command_call_chain_and_log_tail(tmp_path):
    log = tmp_path / "daemon.log"
    log.write_text("".join(f"line {i}\n" for i in range(1, 31)))
    cp = run_bash(
        f'dg_step "starting the daemon" "{log}"\n'
        "check() { grep -q ready \"$1\"; }\n"
        f'start() {{ check "{log}"; }}\n'
        "start\n"
        "echo not reached\n",
        tmp_path,
    )
    assert cp.returncode == 1
    assert "not reached" not in cp.stdout
    err = cp.stderr.splitlines()
    assert err[0] == "[s.sh] FAILED at step 'starting the daemon' (exit 1)"
    assert err[1] == '[s.sh]   command: grep -q ready "$1"'
    assert err[2] == f"[s.sh]   where: check at {tmp_path}/s.sh:3 <- start at {tmp_path}/s.sh:4 <- main at {tmp_path}/s.sh:5"
    assert err[3] == f"[s.sh]   log: {log}"
    assert err[4] == f"----- last 20 lines of {log} -----"
    assert err[5:] == [f"line {i}" for i in range(11, 31)]


def test_trap_catches_a_failure_inside_command_substitution(tmp_path):
    # without inherit_errexit bash ignores the failing `false` inside $(...) and goes on
    cp = run_bash('dg_step "reading the config"\nf() { false; echo late; }\nx="$(f)"\necho "got $x"\n', tmp_path)
    assert cp.returncode == 1 and "got" not in cp.stdout
    assert "FAILED at step 'reading the config' (exit 1)" in cp.stderr
    assert "log: the output above" in cp.stderr


def test_trap_keeps_the_exit_status_and_prints_a_log_directory(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    (d / "a.log").write_text("alpha\n")
    (d / "b.log").write_text("beta\n")
    (d / "c.txt").write_text("not a log\n")
    cp = run_bash(f'dg_step "two daemons" "{d}"\nexit 7\n', tmp_path)
    assert cp.returncode == 7
    assert "FAILED at step 'two daemons' (exit 7)" in cp.stderr
    assert f"----- last 20 lines of {d}/a.log -----\nalpha\n----- last 20 lines of {d}/b.log -----\nbeta\n" in cp.stderr
    assert "not a log" not in cp.stderr


def test_trap_is_silent_on_success_and_after_dg_quiet(tmp_path):
    ok = run_bash('dg_step "x"\ntrue\n', tmp_path)
    assert (ok.returncode, ok.stderr) == (0, "")
    quiet = run_bash('dg_step "x"\ndg_quiet\nexit 1\n', tmp_path)
    assert (quiet.returncode, quiet.stderr) == (1, "")
    notail = run_bash(f'dg_step "child" "{tmp_path}/s.sh" notail\nexit 3\n', tmp_path)
    assert notail.returncode == 3 and f"log: {tmp_path}/s.sh" in notail.stderr and "----- last" not in notail.stderr


def fake_k8s_cache(root: Path, etcd_lines: int) -> Path:
    """A cache dir where build.sh finds every binary: stubs that print version lines."""
    bin_dir = root / "k8s" / "v1.34.12" / "bin"
    bin_dir.mkdir(parents=True)
    stubs = {
        "kube-apiserver": 'echo "Kubernetes v1.34.12"',
        "kube-scheduler": "true",
        "kube-controller-manager": "true",
        # the real etcd prints 3 lines; many lines make an early-closing reader fail every time, not by chance
        "etcd": f'echo "etcd Version: 3.5.1"; for ((i = 0; i < {etcd_lines}; i++)); do echo "Git SHA: $i"; done',
    }
    for name, body in stubs.items():
        p = bin_dir / name
        p.write_text(f"#!/usr/bin/env bash\n{body}\n")
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    # the Kueue manager as build.sh's warm check finds it: bin/kueue and the module's CRDs under src/
    kueue = root / "kueue" / "v0.17.0"
    (kueue / "src" / "config" / "components" / "crd" / "bases").mkdir(parents=True)
    (kueue / "bin").mkdir()
    (kueue / "bin" / "kueue").write_text("#!/usr/bin/env bash\ntrue\n")
    (kueue / "bin" / "kueue").chmod(0o755)
    return bin_dir


@pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root (CI and the test clusters run as root)")
def test_unmount_stale_removes_the_bind_of_a_deleted_checkout_and_keeps_a_live_one(tmp_path):
    # The CI failure this guards: trixie.sh's bind of the checkout, left by an earlier start, survived the
    # checkout being deleted and cloned again at the same path; in the root the path still showed the deleted
    # directory and every 24.11 sbatch said "getcwd failed: No such file or directory".
    mounts = REPO / "resources" / "lib" / "mounts.sh"
    src, dst = tmp_path / "checkout", tmp_path / "root" / "checkout"
    src.mkdir()
    dst.mkdir(parents=True)
    script = f"""source "{mounts}"
src={src}; dst={dst}
mount --bind "$src" "$dst"
trap 'umount -l "$dst" 2>/dev/null || true' EXIT
unmount_stale "$dst" "$src"; is_mounted "$dst" && echo "live kept"
rm -rf "$src"; mkdir "$src"
env -C "$dst" /bin/pwd 2>/dev/null || echo "stale: getcwd fails"
unmount_stale "$dst" "$src"; is_mounted "$dst" || echo "stale removed"
mount --bind "$src" "$dst" && same_dir "$src" "$dst" && env -C "$dst" /bin/pwd
"""
    cp = run_bash(script, tmp_path)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.splitlines() == ["live kept", "stale: getcwd fails", "stale removed", str(dst)]
    assert f"{dst} is a stale mount (no longer {src}): unmounting it" in cp.stderr


def test_build_sh_warm_run_prints_versions_without_sigpipe(tmp_path):
    bin_dir = fake_k8s_cache(tmp_path, etcd_lines=200_000)
    cp = subprocess.run(["bash", str(REPO / "resources/k8s/build.sh")], capture_output=True, text=True,
                        env={**os.environ, "DAGSTER_GPU_CACHE": str(tmp_path)}, timeout=120)  # fmt: skip
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert cp.stdout.splitlines() == [str(bin_dir)]
    assert "Kubernetes v1.34.12\netcd Version: 3.5.1\n" in cp.stderr
    assert "Git SHA" not in cp.stderr


def test_build_sh_without_go_names_the_step(tmp_path):
    bin_dir = fake_k8s_cache(tmp_path, etcd_lines=1)
    (bin_dir / "kube-scheduler").unlink()  # a cold build is needed, and there is no Go on this PATH
    env = {**os.environ, "DAGSTER_GPU_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"}
    if any(Path(d, "go").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("go is installed in /usr/bin or /bin")  # not a service: no marker, never turned into a failure
    cp = subprocess.run(["bash", str(REPO / "resources/k8s/build.sh")], capture_output=True, text=True, env=env, timeout=60)
    assert cp.returncode == 1
    assert "go not found on PATH (need Go >= 1.24)" in cp.stderr
    assert "[build.sh] FAILED at step 'finding Go on PATH' (exit 1)" in cp.stderr


@pytest.mark.postgres
def test_postgres_that_cannot_start_names_the_step_and_prints_its_log(tmp_path):
    """A port already taken: pg_ctl fails, and the script says so with the server log's tail."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        # under /tmp itself: as root the script runs initdb as the postgres user, who cannot enter pytest's 0700 dirs
        d = Path(tempfile.mkdtemp(prefix="dgpu-pg-cannot-start-"))
        d.chmod(0o755)
        env = {**os.environ, "DAGSTER_GPU_PG_DIR": str(d), "DAGSTER_GPU_PG_PORT": str(port)}
        try:
            cp = subprocess.run(["bash", str(REPO / "resources/postgres/postgres.sh"), "start"], capture_output=True,
                                text=True, env=env, timeout=180)  # fmt: skip
        finally:
            shutil.rmtree(d, ignore_errors=True)
    assert cp.returncode == 1
    assert f"[postgres.sh] FAILED at step 'pg_ctl start (127.0.0.1:{port})' (exit 1)" in cp.stderr
    assert f"log: {d}/server.log" in cp.stderr
    assert "Address already in use" in cp.stderr  # the server log's own words, from its tail


# ------------------------------------------------------------------------------- strict e2e under CI
def test_services_required_reads_ci_and_the_test_sh_flag():
    assert services_required({"CI": "true"}) and services_required({"CI": "1"})
    assert services_required({"DAGSTER_GPU_REQUIRE_SERVICES": "1"})
    assert not services_required({}) and not services_required({"CI": "false"})
    assert SERVICE_MARKERS == {"e2e", "slurm", "k8s", "postgres"}


def test_skipped_e2e_test_fails_the_session_under_ci(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "@pytest.mark.slurm\n"
        "def test_needs_slurm():\n"
        "    pytest.skip('the Slurm controller is not running')\n"
        "@pytest.fixture\n"
        "def cluster():\n"
        "    pytest.skip('k8s apiserver not reachable')\n"
        "@pytest.mark.k8s\n"
        "def test_needs_k8s(cluster):\n"
        "    pass\n"
        "def test_unit_may_skip():\n"
        "    pytest.skip('optional dependency')\n"
        "@pytest.mark.e2e\n"
        "@pytest.mark.xfail(reason='known')\n"
        "def test_xfail():\n"
        "    assert False\n"
    )
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "DAGSTER_GPU_REQUIRE_SERVICES")}
    base["PYTHONPATH"] = str(REPO / "tests")
    argv = [str(REPO / ".venv/bin/python"), "-m", "pytest", "-q", "-rA", "-p", "strict_e2e", "-p", "failure_summary", "-p", "no:cacheprovider",
            "-W", "ignore::pytest.PytestUnknownMarkWarning", "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path / "test_x.py")]  # fmt: skip
    failures = tmp_path / "failures.txt"
    ci = subprocess.run(argv, capture_output=True, text=True, env={**base, "CI": "true", "DAGSTER_GPU_PYTEST_FAILURES": str(failures)},
                        cwd=tmp_path, timeout=120)  # fmt: skip
    assert ci.returncode == 1, ci.stdout
    # what scripts/test.sh prints after pytest exited (tests/failure_summary.py)
    assert failures.read_text().splitlines() == [
        "FAILED test_x.py::test_needs_slurm (call): test_x.py::test_needs_slurm: an end-to-end test (markers: slurm) "
        "skipped while services are required (CI=true or DAGSTER_GPU_REQUIRE_SERVICES=1): the Slurm controller is not running",
        "ERROR test_x.py::test_needs_k8s (setup): test_x.py::test_needs_k8s: an end-to-end test (markers: k8s) skipped "
        "while services are required (CI=true or DAGSTER_GPU_REQUIRE_SERVICES=1): k8s apiserver not reachable",
        "pytest exit status 1: 0 passed, 1 failed, 1 error, 1 skipped",
    ]
    assert "1 failed, 1 skipped, 1 xfailed, 1 error" in ci.stdout
    assert "(markers: slurm) skipped while services are required" in ci.stdout
    assert "the Slurm controller is not running" in ci.stdout
    assert "(markers: k8s)" in ci.stdout and "k8s apiserver not reachable" in ci.stdout
    dev = subprocess.run(argv, capture_output=True, text=True, env=base, cwd=tmp_path, timeout=120)
    assert dev.returncode == 0, dev.stdout
    assert "3 skipped, 1 xfailed" in dev.stdout


def test_a_failures_line_quotes_the_assertion_of_the_report():
    report = ("    def test_x():\n>       assert sorted(keys) == ['a', 'b']\nE       AssertionError: assert ['a'] == ['a', 'b']\n"
              "E         Right contains one more item: 'b'\n\ntests/test_x.py:3: AssertionError")
    assert first_error_line(report) == "AssertionError: assert ['a'] == ['a', 'b']"
    assert first_error_line("Failed: Timeout >600.0s\n") == "Failed: Timeout >600.0s"
    assert first_error_line("x" * 400) == "x" * 300


# ------------------------------------------------------------------------------- fault-injection subcommands
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_k8s_restart_component_restarts_it_with_its_own_command_line(tmp_path):
    """``cluster.sh restart-etcd`` (bench/faults.py) stops the process of the pid file and starts the same
    argv again, then waits for its health check: here a stand-in etcd (an HTTP server with a /health file)."""
    port = _free_port()
    www = tmp_path / "www"
    www.mkdir()
    (www / "health").write_text("ok\n")
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(www)]
    (tmp_path / "pids").mkdir()
    (tmp_path / "logs").mkdir()
    old = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    (tmp_path / "pids" / "etcd.pid").write_text(f"{old.pid}\n")
    env = {**os.environ, "DAGSTER_GPU_K8S_DIR": str(tmp_path), "DAGSTER_GPU_K8S_ETCD_PORT": str(port)}
    new_pid = None
    try:
        cp = subprocess.run(["bash", str(REPO / "resources/k8s/cluster.sh"), "restart-etcd"], capture_output=True,
                            text=True, env=env, timeout=120)  # fmt: skip
        assert cp.returncode == 0, cp.stderr[-2000:]
        assert old.wait(timeout=10) is not None  # the old one was stopped (SIGTERM)
        new_pid = int((tmp_path / "pids" / "etcd.pid").read_text())
        assert new_pid != old.pid
        assert Path(f"/proc/{new_pid}/cmdline").read_bytes().split(b"\0")[:-1] == [a.encode() for a in argv]
        assert "etcd ready again" in cp.stderr
    finally:
        if new_pid:
            os.kill(new_pid, 15)
        if old.poll() is None:
            old.kill()


def test_k8s_restart_of_a_component_that_is_not_running_says_so(tmp_path):
    cp = subprocess.run(["bash", str(REPO / "resources/k8s/cluster.sh"), "restart-apiserver"], capture_output=True,
                        text=True, env={**os.environ, "DAGSTER_GPU_K8S_DIR": str(tmp_path)}, timeout=60)  # fmt: skip
    assert cp.returncode == 1
    assert "kube-apiserver is not running" in cp.stderr


def test_slurm_single_daemon_subcommands_need_a_started_cluster(tmp_path):
    for sub in ("restart-slurmctld", "stop-slurmdbd", "start-slurmdbd"):
        cp = subprocess.run(["bash", str(REPO / "resources/slurm/cluster.sh"), sub], capture_output=True, text=True,
                            env={**os.environ, "DAGSTER_GPU_SLURM_DIR": str(tmp_path / "none")}, timeout=60)  # fmt: skip
        assert cp.returncode == 1, sub
        assert f"no cluster under {tmp_path / 'none'}" in cp.stderr and f"FAILED at step '{sub}" in cp.stderr


def test_each_demo_home_has_its_own_database_and_a_browse_script_that_sets_its_services_environment(tmp_path):
    """Found by a new-user run: the demo's browse command failed for PostgreSQL homes (DAGSTER_PG_USER not
    set), and every home shared one database."""
    from pipelines.demo_backends import browse_script, demo_db, instance_yaml

    a, b = tmp_path / "home $(touch pwned)", tmp_path / "other"
    a.mkdir()
    b.mkdir()
    assert re.fullmatch(r"dagster_gpu_demo_[0-9a-f]{8}", demo_db(a)) and demo_db(a) != demo_db(b)
    assert demo_db(a) == demo_db(tmp_path / "other" / ".." / a.name)  # the resolved path decides
    assert f"db_name: {demo_db(a)}" in instance_yaml("kubernetes", 2, a)
    script = browse_script("slurm", a, REPO)
    text = script.read_text()
    assert os.access(script, os.X_OK) and "resources/postgres/postgres.sh env" in text and "slurm/cluster.sh env" in text
    assert "password" not in text.lower().replace("dagster_pg_password", "")  # read from its file when run, never written
    p = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert f"export DAGSTER_HOME='{a.resolve()}'" in text and not (tmp_path / "pwned").exists()
    assert "postgres.sh" not in browse_script("local", b, REPO).read_text()
