"""docs/kubernetes.md's manifests, parsed with PyYAML: each field the launcher relies on is checked (the endpoint is
pod 0 of the Job behind its headless Service, the monitor's port is the probe's and the scrape's, the token comes
from the Secret), and every launcher option given is one the launcher takes."""

import re
from pathlib import Path

import pytest
import yaml

from launcher.cli.main import launch

DOC = Path(__file__).parent.parent / "docs" / "kubernetes.md"


def manifests() -> list:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    return [list(yaml.safe_load_all(block)) for block in blocks]


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def args_of(job) -> dict:
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "launcher"]
    return dict(a.lstrip("-").split("=", 1) for a in container["args"] if a.startswith("--"))


def test_two_manifests_c10d_and_etcd():
    assert len(manifests()) == 2


@pytest.mark.parametrize("index", [0, 1])
def test_each_job_is_indexed_and_serves_its_monitor_to_the_probe_and_the_scrape(index):
    (job,) = by_kind(manifests()[index], "Job")
    spec, pod = job["spec"], job["spec"]["template"]
    assert spec["completionMode"] == "Indexed" and spec["backoffLimit"] == 0
    assert pod["spec"]["restartPolicy"] == "Never"
    args = args_of(job)
    low, high = map(int, args["nnodes"].split(":"))
    assert 1 <= low < high <= spec["completions"] == spec["parallelism"]
    port = int(args["monitor_port"])
    assert args["monitor_host"] == "0.0.0.0"
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) == port
    assert annotations["prometheus.io/path"] == "/metrics"
    container = pod["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    assert port in {p["containerPort"] for p in container["ports"]}
    assert "livenessProbe" not in container or "httpGet" not in container["livenessProbe"]  # 503 during a re-form


def test_the_c10d_endpoint_is_pod_0_behind_the_headless_service():
    docs = manifests()[0]
    (job,), (service,), (secret,) = by_kind(docs, "Job"), by_kind(docs, "Service"), by_kind(docs, "Secret")
    args = args_of(job)
    assert args["rdzv-backend"] == "c10d"
    host, port = args["rdzv-endpoint"].rsplit(":", 1)
    assert host == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}
    assert int(port) in {p["containerPort"] for p in job["spec"]["template"]["spec"]["containers"][0]["ports"]}
    (token,) = [e for e in job["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == "LAUNCHER_JOB_TOKEN"]
    ref = token["valueFrom"]["secretKeyRef"]
    assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]


def test_the_etcd_endpoint_is_the_etcd_service():
    docs = manifests()[1]
    (job,) = by_kind(docs, "Job")
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    args = args_of(job)
    host, port = args["rdzv-endpoint"].rsplit(":", 1)
    assert args["rdzv-backend"] == "etcd" and host in services
    assert int(port) in {p["port"] for p in services[host]["spec"]["ports"]}


def test_every_option_the_manifests_give_is_the_launcher_s():
    known = {o for p in launch.params for o in getattr(p, "opts", ())}
    for docs in manifests():
        for job in by_kind(docs, "Job"):
            given = [a.split("=", 1)[0] for a in job["spec"]["template"]["spec"]["containers"][0]["args"] if a.startswith("--")]
            assert set(given) <= known, set(given) - known
