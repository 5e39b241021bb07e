"""Deployment files checked without a Docker engine or a cluster: lint, schema, and the install path."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

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


def test_the_proxy_is_ready_on_readyz_and_the_engine_on_its_own_health() -> None:
    """Readiness on both containers: the proxy's /readyz covers the engine and recording, /healthz is
    liveness (it stays 200 while the engine loads, so a restart would not help)."""
    ((_, _, pod),) = [p for p in _pods() if p[0] == "llm"]
    containers = {c["name"]: c for c in pod["containers"]}
    proxy = containers.pop("replayproxy")
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert proxy["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    [engine] = containers.values()
    probe = engine["readinessProbe"]["httpGet"]
    assert probe["path"] == "/health" and probe["port"] in {p["name"] for p in engine["ports"]}


def test_replay_job_shards_on_a_common_clock() -> None:
    job = next(
        d for d in yaml.safe_load_all((ROOT / "tools/k8s/replay-job.yaml").read_text()) if d["kind"] == "Job"
    )
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


def _docs() -> list[dict[str, Any]]:
    return [d for path in K8S for d in yaml.safe_load_all(path.read_text()) if d]


def _pods() -> list[tuple[str, int, dict[str, Any]]]:
    """(workload name, pods that run at once, pod spec) of every Deployment and Job."""
    found = []
    for doc in _docs():
        if doc["kind"] in ("Deployment", "Job"):
            count = (
                doc["spec"].get("replicas", 1) if doc["kind"] == "Deployment" else doc["spec"]["parallelism"]
            )
            found.append((doc["metadata"]["name"], count, doc["spec"]["template"]["spec"]))
    return found


def _image_user() -> int:
    return int(re.search(r"^USER (\d+)$", (ROOT / "Dockerfile").read_text(), re.M).group(1))  # type: ignore[union-attr]


def test_every_claim_a_pod_mounts_is_defined_and_none_is_shared_read_write_once() -> None:
    claims = {
        d["metadata"]["name"]: d["spec"]["accessModes"]
        for d in _docs()
        if d["kind"] == "PersistentVolumeClaim"
    }
    pods_per_claim: dict[str, int] = {}
    for name, count, pod in _pods():
        for volume in pod["volumes"]:
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            if claim:
                assert claim in claims, f"{name} mounts claim {claim!r}, which no manifest defines"
                pods_per_claim[claim] = pods_per_claim.get(claim, 0) + count
    assert pods_per_claim, "no workload mounts a claim"
    for claim, pods in pods_per_claim.items():
        if pods > 1:
            assert "ReadWriteOnce" not in claims[claim], f"{claim} is ReadWriteOnce but {pods} pods mount it"


def test_the_image_user_can_read_the_hash_key_and_the_secret_is_never_in_a_manifest() -> None:
    user = _image_user()
    ((_, _, pod),) = [p for p in _pods() if p[0] == "llm"]
    proxy = next(c for c in pod["containers"] if c["name"] == "replayproxy")
    key_file = next(e["value"] for e in proxy["env"] if e["name"] == "REPLAYPROXY_PROXY_HASH_KEY_FILE")
    mount = next(m for m in proxy["volumeMounts"] if key_file.startswith(m["mountPath"] + "/"))
    secret = next(v["secret"] for v in pod["volumes"] if v["name"] == mount["name"])
    context = {**pod.get("securityContext", {}), **proxy.get("securityContext", {})}
    assert context["runAsUser"] == user
    mode = secret["defaultMode"]
    readable = mode & 0o004 or (mode & 0o040 and context.get("fsGroup") is not None)
    assert readable, f"mode {mode:o} lets uid {user} (not the file's owner, root) read nothing"
    # The Secret is created with the documented command, under the name and key the pod uses.
    text = (ROOT / "tools/k8s/sidecar-deployment.yaml").read_text()
    file_name = key_file.rsplit("/", 1)[1]
    assert f"kubectl create secret generic {secret['secretName']}" in text
    assert f"--from-literal={file_name}=" in text
    assert not [d for d in _docs() if d["kind"] == "Secret"], "a key in a manifest is known to everyone"


def test_the_replay_job_reads_the_directory_the_sidecar_writes() -> None:
    pods = {name: pod for name, _, pod in _pods()}
    proxy = next(c for c in pods["llm"]["containers"] if c["name"] == "replayproxy")
    trace_dir = proxy["args"][proxy["args"].index("--trace-dir") + 1]
    sidecar_volume = next(m["name"] for m in proxy["volumeMounts"] if m["mountPath"] == trace_dir)
    claim = next(v for v in pods["llm"]["volumes"] if v["name"] == sidecar_volume)["persistentVolumeClaim"]
    job = pods["replay-staging"]
    replay = job["containers"][0]
    command = " ".join(replay["args"]).split()
    source = command[command.index("replay") + 1]
    job_volume = next(v["name"] for v in job["volumes"] if v.get("persistentVolumeClaim") == claim)
    job_mount = next(m["mountPath"] for m in replay["volumeMounts"] if m["name"] == job_volume)
    assert source == job_mount, f"the Job replays {source}, but the sidecar's traces are in {job_mount}"
    assert job.get("securityContext", {}).get("runAsUser") == _image_user()
    assert "--progress log" in " ".join(replay["args"])  # a Job's log shows the run going


def test_the_image_has_the_report_extra_for_html_reports_and_the_demo() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert '".[report,storage]"' in text and '"replayproxy[report,storage]"' in text
