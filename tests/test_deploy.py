"""Deployment files checked without a Docker engine or a cluster: lint, schema, and the install path."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
K8S = sorted((ROOT / "tools" / "k8s").glob("*.yaml"))


def _tool(name: str) -> str:
    path = shutil.which(name) or str(Path(sys.executable).parent / name)
    if not Path(path).exists():
        pytest.skip(f"{name} is not installed (it comes with the [test] extra)")
    return path


def test_dockerfile_passes_hadolint() -> None:
    done = subprocess.run([_tool("hadolint"), str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_runs_as_non_root_with_healthcheck_and_volume() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "\nUSER 10001\n" in text
    assert "HEALTHCHECK" in text and "/healthz" in text
    assert 'VOLUME ["/traces"]' in text
    assert 'ENTRYPOINT ["replayproxy"]' in text


@pytest.mark.parametrize("path", K8S, ids=lambda p: p.name)
def test_kubernetes_manifests_validate_against_the_schema(path: Path) -> None:
    done = subprocess.run(
        [_tool("kubernetes-validate"), "--strict", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_sidecar_service_targets_the_proxy_and_key_comes_from_a_secret() -> None:
    docs = {
        d["kind"]: d for d in yaml.safe_load_all((ROOT / "tools/k8s/sidecar-deployment.yaml").read_text())
    }
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    proxy = next(c for c in pod["containers"] if c["name"] == "replayproxy")
    assert docs["Service"]["spec"]["ports"][0]["targetPort"] in {p["name"] for p in proxy["ports"]}
    assert {"name": "REPLAYPROXY_PROXY_HASH_KEY_FILE", "value": "/etc/replayproxy/hash.key"} in proxy["env"]
    assert any(v.get("secret", {}).get("secretName") == "replayproxy-hash-key" for v in pod["volumes"])


def test_replay_job_shards_on_a_common_clock() -> None:
    job = yaml.safe_load((ROOT / "tools/k8s/replay-job.yaml").read_text())
    assert job["spec"]["completionMode"] == "Indexed"
    n = job["spec"]["completions"]
    command = " ".join(job["spec"]["template"]["spec"]["containers"][0]["args"])
    assert f'--shard "${{JOB_COMPLETION_INDEX}}/{n}"' in command
    assert "--start-at" in command


def test_the_license_is_an_spdx_string_for_a_setuptools_that_reads_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in project["build-system"]["requires"]  # the first to accept the string


def test_the_image_install_steps_work_in_a_plain_venv(tmp_path: Path) -> None:
    """The Dockerfile's two steps: build a wheel of the source tree, install it from that wheel alone."""
    wheels, venv = tmp_path / "wheels", tmp_path / "venv"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)]
    built = subprocess.run(build, check=True, timeout=300, capture_output=True, text=True)
    assert "deprecated" not in (built.stdout + built.stderr).lower(), built.stderr
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    wheel = next(wheels.glob("replayproxy-*.whl"))
    install = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        str(venv / "bin/python"),
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        str(wheel),
    ]
    subprocess.run(install, check=True, timeout=300, capture_output=True)
    done = subprocess.run(
        [str(venv / "bin/replayproxy"), "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("replayproxy ")
