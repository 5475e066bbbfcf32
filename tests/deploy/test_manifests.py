"""deploy/compose.yaml and deploy/kubernetes/: names and numbers that must agree with the app.

No cluster here: these check the files against the code (every SPO_* name is a real setting, probe
paths are the app's and answer, ports agree with the image's PORT, the grace period covers the
graceful stop), not that Kubernetes would accept them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from flask.testing import FlaskClient

from app import create_app
from app.core.settings import FIELDS, PREFIX, Settings
from app.core.sizing import Limit, Machine, plan
from nlp.config import DEMO_MODEL_DIR, DEMO_NER_MODEL_DIR
from nlp.manifest import load_manifest

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
COMPOSE = ROOT / "deploy" / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
SETTING_NAMES = {PREFIX + name.upper() for name in FIELDS}
SUPERVISOR_KILL_AFTER_S = (
    5  # app.serving.supervisor: what is left is killed SPO_GRACEFUL_TIMEOUT + 5 s in
)


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def _kind(kind: str) -> dict[str, Any]:
    found = [
        d for p in sorted(KUBERNETES.glob("*.yaml")) for d in _docs(p) if d.get("kind") == kind
    ]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def _container() -> dict[str, Any]:
    containers = _kind("Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _config() -> dict[str, str]:
    data: dict[str, str] = _kind("ConfigMap")["data"]
    return data


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _compose_service() -> dict[str, Any]:
    services = _docs(COMPOSE)[0]["services"]
    assert list(services) == ["spo"]
    service: dict[str, Any] = services["spo"]
    return service


@pytest.mark.parametrize(
    "path",
    [*sorted(KUBERNETES.glob("*.yaml")), COMPOSE, DOCKERFILE],
    ids=lambda p: p.name,
)
def test_deploy_files_name_only_real_settings(path: Path) -> None:
    # Comments included: a documented name that is not a setting misleads as much as a used one.
    names = set(re.findall(r"\bSPO_[A-Z0-9_]+\b", path.read_text(encoding="utf-8")))
    unknown = names - SETTING_NAMES
    assert not unknown, f"{path.name}: not settings of app.core.settings: {sorted(unknown)}"


def test_configmap_values_parse_as_settings(tmp_path: Path) -> None:
    # Every value is one Settings.from_env accepts; the paths the pod mounts are made here.
    env = dict(_config())
    env["SPO_MODELS"] = f"demo={DEMO_MODEL_DIR},ner={DEMO_NER_MODEL_DIR}"
    tokens = tmp_path / "tokens"
    tokens.write_text("a-real-token-0123456789\n", encoding="utf-8")  # the example's are refused
    env["SPO_AUTH_TOKENS_FILE"] = str(tokens)
    settings = Settings.from_env(env)
    assert settings.graceful_timeout == int(env["SPO_GRACEFUL_TIMEOUT"])


class _StandIn:
    """A loaded model as far as the probes are concerned: a manifest, nothing to run."""

    def __init__(self, directory: Path) -> None:
        self.manifest = load_manifest(directory, check_files=False)

    def close(self) -> None:
        pass


@pytest.fixture
def client() -> Iterator[FlaskClient]:
    settings = Settings.from_env(
        {"SPO_MODELS": f"demo={DEMO_MODEL_DIR},ner={DEMO_NER_MODEL_DIR}", "SPO_WORKERS": "1"}
    )
    loader: Any = lambda options: _StandIn(DEMO_MODEL_DIR)  # noqa: E731
    yield create_app(settings, loader=loader).test_client()


def _probes() -> dict[str, dict[str, Any]]:
    container = _container()
    return {k: container[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")}


def test_kubernetes_probes_are_the_apps_health_paths(client: FlaskClient) -> None:
    probes = _probes()
    assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert probes["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for name, probe in probes.items():
        response = client.get(probe["httpGet"]["path"])
        assert response.status_code == 200, (
            f"{name}: {probe['httpGet']['path']} answered {response.status}"
        )
    annotations = _kind("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert client.get(annotations["prometheus.io/path"]).status_code in (200, 401)


def test_kubernetes_liveness_outwaits_a_full_worker_queue() -> None:
    """Under overload /healthz waits for a worker thread behind extraction requests, each answered
    by its deadline (counted from nginx): a liveness timeout under SPO_REQUEST_TIMEOUT restarted
    pods that were only busy."""
    deadline = float(_config()["SPO_REQUEST_TIMEOUT"])
    liveness = _probes()["livenessProbe"]
    assert liveness["timeoutSeconds"] > deadline + 1
    # /readyz waits in the same queue: a busy pod is not an unready one (with 2 s, a traffic spike
    # took every pod out of rotation at once). The image's and compose's health checks too.
    assert _probes()["readinessProbe"]["timeoutSeconds"] > deadline + 1
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    compose = " ".join(_compose_service()["healthcheck"]["test"])
    for check in (dockerfile.split("HEALTHCHECK", 1)[1].split("\n\n")[0], compose):
        (timeout,) = re.findall(r"timeout=(\d+)\)", check)
        assert int(timeout) > deadline + 1, check


def test_kubernetes_ports_agree_with_the_image() -> None:
    container = _container()
    (port,) = container["ports"]
    port_env = _env(container)["PORT"]
    assert port["containerPort"] == int(port_env) == 8080
    assert re.search(r"^ENV .*PORT=8080\b", DOCKERFILE.read_text(), re.M | re.S)
    for probe in _probes().values():
        assert probe["httpGet"]["port"] == port["name"]
    (service_port,) = _kind("Service")["spec"]["ports"]
    assert service_port["targetPort"] == port["name"]
    annotations = _kind("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == port_env


def test_kubernetes_grace_period_covers_the_graceful_stop() -> None:
    pod = _kind("Deployment")["spec"]["template"]["spec"]
    pre_stop = _container()["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    graceful = int(_config()["SPO_GRACEFUL_TIMEOUT"])
    assert int(_config()["SPO_REQUEST_TIMEOUT"]) < graceful
    assert (
        pod["terminationGracePeriodSeconds"] > int(pre_stop[1]) + graceful + SUPERVISOR_KILL_AFTER_S
    )


def test_kubernetes_startup_probe_allows_the_documented_budget() -> None:
    from tests.deploy.test_image import STARTUP_BUDGET_S

    probe = _probes()["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= STARTUP_BUDGET_S
    # The worker timeout covers a worker's load and warm-up too.
    assert int(_config()["SPO_TIMEOUT"]) >= STARTUP_BUDGET_S


def test_kubernetes_resources_size_the_workers_the_docs_say() -> None:
    resources = _container()["resources"]
    assert resources["requests"] == resources["limits"]  # Guaranteed QoS
    cpus = float(resources["limits"]["cpu"])
    memory = resources["limits"]["memory"]
    assert memory.endswith("Gi")
    limit = int(memory[:-2]) << 30
    settings = Settings.from_env({"SPO_MODELS": f"demo={DEMO_MODEL_DIR},ner={DEMO_NER_MODEL_DIR}"})
    machine = Machine(affinity=64, quota=Limit(cpus, "test"), memory=Limit(limit, "test"))
    sizing = plan(machine, worker_rss_mib=settings.sizing().worker_rss_mib)
    assert sizing.workers == 2, sizing.lines()
    # The RSS watchdog retires a worker before the pod's memory limit is reached.
    watchdog = int(_config()["SPO_MAX_WORKER_RSS_MB"])
    assert sizing.workers * watchdog * (1 << 20) < limit


def test_kubernetes_tokens_come_from_the_mounted_secret() -> None:
    token_file = Path(_config()["SPO_AUTH_TOKENS_FILE"])
    container = _container()
    pod = _kind("Deployment")["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [m for m in mounts.values() if token_file.parent == Path(m["mountPath"])]
    secret = volumes[mount["name"]]["secret"]
    assert secret["secretName"] == _kind("Secret")["metadata"]["name"]
    assert token_file.name in {i["path"] for i in secret["items"]}
    assert token_file.name in _kind("Secret")["stringData"]


def test_kubernetes_example_secret_is_never_applied_and_never_serves() -> None:
    """`kubectl apply -k` created the Secret from placeholders that passed the token rule: the
    API and /metrics took tokens anyone could read here, and an apply put them back over a
    Secret made out of band."""
    import tempfile

    from app.core.settings import Settings, SettingsError, read_tokens_file

    kustomization = _docs(KUBERNETES / "kustomization.yaml")[0]
    assert "secret.yaml" not in kustomization["resources"]
    assert all((KUBERNETES / r).is_file() for r in kustomization["resources"])
    values = _kind("Secret")["stringData"]
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as tokens:
        tokens.write(values["tokens"])
        tokens.flush()
        assert read_tokens_file(Path(tokens.name))[1] is not None  # refused at start
    config = {k: v for k, v in _config().items() if k != "SPO_AUTH_TOKENS_FILE"}
    with pytest.raises(SettingsError, match="SPO_METRICS_TOKEN"):
        Settings.from_env({**config, "SPO_METRICS_TOKEN": values["metrics-token"]})


def test_kubernetes_metrics_directory_is_an_emptydir() -> None:
    container = _container()
    metrics_dir = _env(container)["PROMETHEUS_MULTIPROC_DIR"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == metrics_dir]
    volumes = {v["name"]: v for v in _kind("Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes[mount["name"]]


def test_compose_ports_health_and_grace_agree_with_the_app(client: FlaskClient) -> None:
    service = _compose_service()
    env = service["environment"]
    assert service["image"] == "spo-service:latest"
    (published,) = service["ports"]
    assert published.rsplit(":", 1)[1] == env["PORT"]
    test = " ".join(service["healthcheck"]["test"])
    match = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", test)
    assert match and match[1] == env["PORT"]
    assert client.get(match[2]).status_code == 200
    grace = int(service["stop_grace_period"].removesuffix("s"))
    assert grace > int(env["SPO_GRACEFUL_TIMEOUT"]) + SUPERVISOR_KILL_AFTER_S
    assert any(str(t).startswith(env["PROMETHEUS_MULTIPROC_DIR"]) for t in service["tmpfs"])
    assert any(str(v).endswith(":/models") or ":/models:" in str(v) for v in service["volumes"])
    # The RSS watchdog retires a worker before the container's memory limit is reached (without
    # the setting, its default of 4,096 MiB was over the 3 GiB limit: the OOM killer came first).
    assert service["mem_limit"].endswith("g")
    limit = int(service["mem_limit"][:-1]) << 30
    cpus = float(service["cpus"])
    machine = Machine(affinity=64, quota=Limit(cpus, "test"), memory=Limit(limit, "test"))
    given = {k: str(v) for k, v in env.items() if k.startswith("SPO_")}
    assert given.pop("SPO_MODELS") == "demo=/models/demo,ner=/models/ner"  # the image's, here:
    given["SPO_MODELS"] = f"demo={DEMO_MODEL_DIR},ner={DEMO_NER_MODEL_DIR}"
    settings = Settings.from_env(given)
    sizing = plan(machine, worker_rss_mib=settings.sizing().worker_rss_mib)
    assert sizing.workers * settings.max_worker_rss_mb * (1 << 20) < limit, sizing.lines()
