"""docker-compose.yml cannot run here (no Docker engine), so check it statically against the code: commands and
flags, ports, topics, the observability stack (Jaeger, Prometheus, Grafana) and every metric the dashboard queries."""

import importlib
import importlib.util
import json
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client import REGISTRY, CollectorRegistry

import shardyard.metrics  # noqa: F401 - registers the process metrics on the default registry
from shardyard.bus.topics import BY_NAME
from shardyard.settings import BOOTSTRAP_ENV, ServiceSettings, load_settings

ROOT = Path(__file__).parents[3]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SHARDYARD = {
    name: svc
    for name, svc in COMPOSE["services"].items()
    if svc.get("image") == "shardyard:dev" and "restart" in svc  # not the one-shot set-up of the broker
}
SETTINGS = {
    "shardyard.queue": "shardyard.queue.app:QueueSettings",
    "shardyard.scheduler": "shardyard.scheduler.app:SchedulerSettings",
    "shardyard.resource_pool": "shardyard.resource_pool.app:PoolSettings",
    "shardyard.fault_manager": "shardyard.fault_manager.app:FaultSettings",
    "shardyard.accounting": "shardyard.accounting.app:AccountingSettings",
    "shardyard.monitor": "shardyard.monitor.app:MonitorSettings",
    "shardyard.node_agent": "shardyard.node_agent.app:AgentSettings",
}
PROMETHEUS: dict[str, Any] = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD: dict[str, Any] = json.loads((GRAFANA / "dashboards" / "shardyard.json").read_text())
CLUSTER_JOB = "cluster"
"""The scrape job of the monitor's cluster metrics (its status API); every other job is one service's processes."""


def settings_class(module: str) -> type[ServiceSettings]:
    path, name = SETTINGS[module].split(":")
    cls: type[ServiceSettings] = getattr(importlib.import_module(path), name)
    return cls


def settings_of(name: str) -> ServiceSettings:
    """The settings compose's command and environment give that container's process."""
    module, *argv = SHARDYARD[name]["command"]
    return load_settings(settings_class(module), argv, SHARDYARD[name]["environment"], prog=module)


def test_every_service_and_three_agents_are_there() -> None:
    modules = [svc["command"][0] for svc in SHARDYARD.values()]
    assert set(SETTINGS) <= set(modules)
    assert modules.count("shardyard.node_agent") >= 3


@pytest.mark.parametrize(
    "module", ["shardyard.queue", "shardyard.scheduler", "shardyard.resource_pool", "shardyard.fault_manager"]
)
def test_every_elected_service_runs_two_replicas_under_distinct_names(module: str) -> None:
    instances = [svc["command"][2] for svc in SHARDYARD.values() if svc["command"][0] == module]
    assert len(set(instances)) == len(instances) >= 2


def test_kafka_accepts_the_election_session_timeout(broker_files: Path) -> None:
    floor = int(server_properties(broker_files)["group.min.session.timeout.ms"])
    settings = settings_class("shardyard.scheduler")()
    assert floor <= settings.election_session_timeout_ms  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(SHARDYARD), ids=str)
def test_command_names_a_real_module_with_valid_flags(name: str) -> None:
    module, *argv = SHARDYARD[name]["command"]
    assert importlib.util.find_spec(f"{module}.__main__") is not None
    environment = SHARDYARD[name]["environment"]
    settings = load_settings(settings_class(module), argv, environment, prog=module)
    assert settings.bootstrap == environment[BOOTSTRAP_ENV] == "kafka:9092"


def test_dockerfile_copies_both_source_roots() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "COPY libs" in dockerfile and "COPY services" in dockerfile


# --- ports: every process's metrics, the status API -----------------------------------------------------------------
def scrape_targets() -> dict[str, list[str]]:
    """Scrape job -> its static targets (``host:port``)."""
    return {
        job["job_name"]: [target for config in job.get("static_configs", []) for target in config["targets"]]
        for job in PROMETHEUS["scrape_configs"]
    }


def published(service: dict[str, Any]) -> set[int]:
    """The container ports a compose service publishes (``HOST:CONTAINER``)."""
    return {int(str(entry).split(":")[-1]) for entry in service.get("ports", [])}


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> the repository folder bound there (``./SOURCE:TARGET[:ro]``)."""
    out = {}
    for entry in service.get("volumes", []):
        source, target, *_ = entry.split(":")
        if source.startswith("./"):
            out[target] = (ROOT / source).resolve()
    return out


@pytest.mark.parametrize("name", sorted(SHARDYARD), ids=str)
def test_every_process_serves_metrics_where_prometheus_scrapes_it(name: str) -> None:
    settings = settings_of(name)
    scraped = {target for job, targets in scrape_targets().items() if job != CLUSTER_JOB for target in targets}

    assert settings.metrics_port > 0 and settings.metrics_host == "0.0.0.0"
    assert f"{name}:{settings.metrics_port}" in scraped


@pytest.mark.parametrize("job", sorted(set(scrape_targets()) - {CLUSTER_JOB, "prometheus"}), ids=str)
def test_a_service_scrape_job_names_that_services_processes_on_their_metrics_port(job: str) -> None:
    for target in scrape_targets()[job]:
        host, port = target.rsplit(":", 1)
        assert host in SHARDYARD, f"{target}: no such compose service"
        assert SHARDYARD[host]["command"][0] == "shardyard." + job.replace("-", "_")
        assert settings_of(host).metrics_port == int(port)


def test_the_cluster_job_scrapes_the_monitors_status_api_and_keeps_the_training_job_label() -> None:
    [target] = scrape_targets()[CLUSTER_JOB]
    host, port = target.rsplit(":", 1)
    settings = settings_of(host)
    [job] = [job for job in PROMETHEUS["scrape_configs"] if job["job_name"] == CLUSTER_JOB]

    assert SHARDYARD[host]["command"][0] == "shardyard.monitor"
    assert settings.http_port == int(port) and settings.http_host == "0.0.0.0"  # type: ignore[attr-defined]
    assert int(port) in published(SHARDYARD[host])
    assert job["honor_labels"] is True  # per-shard series carry job="<training job>"


def test_prometheus_loads_this_config_and_the_alert_rules() -> None:
    service = COMPOSE["services"]["prometheus"]
    [config] = [arg.split("=", 1)[1] for arg in service["command"] if arg.startswith("--config.file=")]
    folder, file = config.rsplit("/", 1)

    assert mounts(service)[folder] == (ROOT / "deploy" / "prometheus").resolve() and file == "prometheus.yml"
    assert "alerts.yml" in PROMETHEUS["rule_files"]  # resolved next to prometheus.yml, in the same mount
    assert 9090 in published(service)


# --- traces ---------------------------------------------------------------------------------------------------------
def test_jaeger_takes_otlp_on_the_port_every_process_sends_to() -> None:
    jaeger = COMPOSE["services"]["jaeger"]
    assert jaeger["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    assert {16686, 4317, 4318} <= published(jaeger)
    for name, service in SHARDYARD.items():
        environment = service["environment"]
        endpoint = urlsplit(environment["OTEL_EXPORTER_OTLP_ENDPOINT"])
        # OTLP over HTTP (the default protocol) is Jaeger's 4318; gRPC would be 4317.
        assert (endpoint.scheme, endpoint.hostname, endpoint.port) == ("http", "jaeger", 4318), name
        assert environment.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf") == "http/protobuf", name
        assert "OTEL_SERVICE_NAME" not in environment, f"{name}: the code names each service"


# --- topics ---------------------------------------------------------------------------------------------------------
def _is_module(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except ModuleNotFoundError:
        return False


def test_every_topic_compose_names_exists() -> None:
    # Dotted names not inside a path (``.../shardyard.json``): modules, else topics.
    dotted = set(re.findall(r"(?<![\w/.-])shardyard(?:\.[a-z_]+)+", (ROOT / "docker-compose.yml").read_text()))
    topics = {name for name in dotted if not _is_module(name)}

    assert topics, "compose names the submissions topic"
    assert topics <= set(BY_NAME), f"unknown topics: {sorted(topics - set(BY_NAME))}"


# --- Grafana --------------------------------------------------------------------------------------------------------
def test_grafana_reads_prometheus_and_loads_the_dashboard_folder() -> None:
    grafana = COMPOSE["services"]["grafana"]
    bound = mounts(grafana)
    provisioning = bound["/etc/grafana/provisioning"]
    [source] = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    [provider] = yaml.safe_load((provisioning / "dashboards" / "shardyard.yml").read_text())["providers"]
    url = urlsplit(source["url"])
    dashboards = bound[provider["options"]["path"]]

    assert provisioning == (GRAFANA / "provisioning").resolve()
    assert url.hostname == "prometheus" and url.port == 9090 and 9090 in published(COMPOSE["services"][url.hostname])
    assert (dashboards / "shardyard.json").is_file()
    assert {uid for uid in _walk(DASHBOARD, "uid") if uid != DASHBOARD["uid"]} == {source["uid"]}


def test_dashboard_panels_have_distinct_ids_and_do_not_overlap() -> None:
    taken: dict[tuple[int, int], str] = {}
    for panel in DASHBOARD["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for cell in [
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        ]:
            assert cell not in taken, f"{panel['title']} overlaps {taken[cell]}"
            taken[cell] = panel["title"]
    ids = [panel["id"] for panel in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))


def _walk(node: object, key: str) -> list[Any]:
    """Every value under ``key`` anywhere in a JSON document."""
    if isinstance(node, dict):
        found = [node[key]] if key in node else []
        return found + [value for child in node.values() for value in _walk(child, key)]
    if isinstance(node, list):
        return [value for child in node for value in _walk(child, key)]
    return []


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and template variable queries."""
    templated = [v["query"]["query"] for v in DASHBOARD["templating"]["list"] if v["type"] == "query"]
    return [*_walk(DASHBOARD, "expr"), *templated]


SAMPLE_NAMES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def exported_names() -> set[str]:
    """The sample names both kinds of /metrics serve: the monitor's (a cluster view fed a few events) and a
    process's (the default registry: Shardyard's process metrics and prometheus-client's collectors)."""
    from shardyard.monitor.metrics import make_registry
    from shardyard.monitor.views import ClusterView
    from tests.unit.builders import heartbeat, node_state, progress
    from tests.unit.monitor.test_monitor_metrics import running

    view = ClusterView()
    for event in [*running("job-1", 5), node_state("node-a"), heartbeat("node-a"), progress("job-1", syncs=1)]:
        view.apply(event)
    monitor, _events = make_registry(view)
    registries: list[CollectorRegistry] = [monitor, REGISTRY]
    return {
        family.name + suffix
        for registry in registries
        for family in registry.collect()
        for suffix in SAMPLE_NAMES.get(family.type, ("",))
    }


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    exported = exported_names()
    queried = {name for query in dashboard_queries() for name in re.findall(r"\b(?:shardyard|process)_[a-z_]+", query)}

    assert queried, "the dashboard queries metrics"
    assert sorted(queried - exported) == []


@pytest.mark.parametrize(
    "metric",
    [
        "shardyard_queue_jobs",
        "shardyard_nodes",
        "shardyard_gpu_utilization_ratio",
        "shardyard_gpu_memory_used_bytes",
        "shardyard_gpu_temperature_celsius",
        "shardyard_node_cpu_load_ratio",
        "shardyard_shard_step",
        "shardyard_shard_loss",
        "shardyard_shard_samples_per_second",
        "shardyard_allreduce_seconds_total",
        "shardyard_allreduce_bytes_total",
        "shardyard_heartbeat_lag_seconds",
        "shardyard_node_mean_rtt_seconds",
        "shardyard_shard_failures_total",
        "shardyard_spare_ratio",
        "shardyard_recovery_seconds_bucket",
        "shardyard_consumer_lag_messages",
        "shardyard_placement_cycle_seconds_bucket",
    ],
)
def test_the_dashboard_shows_every_s7_figure(metric: str) -> None:
    assert any(re.search(rf"\b{metric}\b", query) for query in dashboard_queries())


def test_every_service_is_restarted_when_it_dies() -> None:
    """As ``shardyard up``'s supervisor restarts what dies locally: compose's ``unless-stopped`` for every container
    but the one-shot set-up jobs others wait to have completed (the certificates, the credentials and ACLs)."""
    one_shot = {
        name
        for svc in COMPOSE["services"].values()
        if isinstance(svc.get("depends_on"), dict)
        for name, wait in svc["depends_on"].items()
        if wait.get("condition") == "service_completed_successfully"
    }
    assert one_shot == {"kafka-files", "kafka-setup"}
    policies = {name: svc.get("restart") for name, svc in COMPOSE["services"].items() if name not in one_shot}
    assert policies and all(policy == "unless-stopped" for policy in policies.values()), policies
    assert all("restart" not in COMPOSE["services"][name] for name in one_shot)


# --- the broker: its settings and security from the code the tests run (shardyard.broker.compose) -------------------
TEAMS = ("team-a", "team-b")


@pytest.fixture
def broker_files(tmp_path: Path) -> Path:
    """What compose's kafka-files writes into the secrets volume, written here."""
    from shardyard.broker.compose import write_files

    write_files(tmp_path, TEAMS)
    return tmp_path


def server_properties(folder: Path) -> dict[str, str]:
    lines = (folder / "server.properties").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def principal(name: str) -> str:
    return "node-agent" if SHARDYARD[name]["command"][0] == "shardyard.node_agent" else re.sub(r"-\d+$", "", name)


def test_compose_runs_the_kafka_the_tests_run() -> None:
    pom = (ROOT / "deploy" / "kafka" / "pom.xml").read_text()
    version = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)
    assert version is not None
    assert COMPOSE["services"]["kafka"]["image"] == f"apache/kafka:{version.group(1)}"


def test_the_one_shot_containers_run_the_compose_module_of_the_shardyard_image() -> None:
    files, setup = COMPOSE["services"]["kafka-files"], COMPOSE["services"]["kafka-setup"]
    assert files["image"] == setup["image"] == "shardyard:dev"
    assert "python -m shardyard.broker.compose files /secrets" in files["command"][-1]
    assert "python -m shardyard.broker.compose setup kafka:9092 /secrets" in setup["command"][-1]
    assert files["environment"]["SHARDYARD_TEAMS"] == setup["environment"]["SHARDYARD_TEAMS"]
    assert COMPOSE["services"]["kafka"]["entrypoint"] == ["/bin/bash", "/secrets/start-kafka.sh"]


def test_the_broker_has_the_shared_settings_and_takes_only_tls_with_scram(broker_files: Path) -> None:
    from shardyard.broker.properties import shared_properties

    found = server_properties(broker_files)
    assert shared_properties().items() <= found.items()
    protocols = dict(pair.split(":") for pair in found["listener.security.protocol.map"].split(","))
    assert protocols == {"CLIENTS": "SASL_SSL", "EXTERNAL": "SASL_SSL", "CONTROLLER": "SSL"}
    assert found["listener.name.controller.ssl.client.auth"] == "required"
    assert found["advertised.listeners"] == "CLIENTS://kafka:9092,EXTERNAL://localhost:9094"
    assert found["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert found["allow.everyone.if.no.acl.found"] == "false"
    assert found["authorizer.class.name"].endswith("StandardAuthorizer")
    assert found["ssl.keystore.location"] == "/secrets/broker.pem"
    assert COMPOSE["services"]["kafka"]["ports"] == ["9094:9094"]
    start = (broker_files / "start-kafka.sh").read_text()
    assert "kafka-storage.sh format --ignore-formatted" in start and "kafka-server-start.sh" in start
    assert subprocess.run(["bash", "-n", str(broker_files / "start-kafka.sh")], check=False).returncode == 0
    assert all((broker_files / name).stat().st_mode & 0o077 == 0 for name in ("server.properties", "start-kafka.sh"))


def test_compose_and_the_local_broker_differ_only_in_where_they_listen(broker_files: Path, tmp_path: Path) -> None:
    """The local secured broker the tests start (``shardyard up``) and compose's are configured by one function:
    what differs is addresses and paths."""
    from shardyard.broker.install import KafkaInstall
    from shardyard.broker.kafka import LocalKafka
    from shardyard.broker.secure import Access, make_access

    install = KafkaInstall(tmp_path, "any", "java")  # only its configuration is read: nothing starts
    local = LocalKafka(folder=tmp_path / "local", install=install, access=make_access(tmp_path / "access", TEAMS))
    local.port, local.controller_port = 9092, 9093
    local.properties_file.parent.mkdir(parents=True)
    properties = local.properties()
    compose = server_properties(broker_files)
    where = {
        "listeners",
        "advertised.listeners",
        "controller.quorum.voters",
        "log.dirs",
        "ssl.keystore.location",
        "ssl.truststore.location",
        "listener.security.protocol.map",  # compose has a second client listener, for the host
        "listener.name.external.scram-sha-512.sasl.jaas.config",
        "listener.name.clients.scram-sha-512.sasl.jaas.config",  # the admin's password: each cluster its own
    }
    differ = {name for name in properties.keys() | compose.keys() if properties.get(name) != compose.get(name)}
    assert differ <= where, differ - where
    assert isinstance(local.access, Access)


@pytest.mark.parametrize("name", sorted(SHARDYARD), ids=str)
def test_every_process_is_its_own_principal_over_tls_and_seals_its_events(name: str) -> None:
    from shardyard.broker.access import grants, principals
    from shardyard.bus.transport import client_options

    env = SHARDYARD[name]["environment"]
    who = principal(name)
    assert env["SHARDYARD_KAFKA_USERNAME"] == who and env["SHARDYARD_KAFKA_PASSWORD_FILE"] == f"/secrets/{who}"
    assert env["SHARDYARD_KAFKA_CA_FILE"] == "/secrets/ca.pem"
    assert env["SHARDYARD_CLUSTER_SECRET_FILE"] == "/secrets/cluster.secret"
    readable = {**env, "SHARDYARD_KAFKA_PASSWORD_FILE": __file__, "SHARDYARD_KAFKA_CA_FILE": ""}
    assert client_options(readable)["security_protocol"] == "SASL_SSL"
    assert who in principals(TEAMS) and any(grant.principal == who for grant in grants(TEAMS))


def test_kafka_files_writes_every_password_a_process_reads(broker_files: Path) -> None:
    for name in SHARDYARD:
        assert (broker_files / principal(name)).stat().st_mode & 0o077 == 0
    assert all((broker_files / f"team.{team}").is_file() for team in TEAMS)
    assert (broker_files / "cluster.secret").is_file() and (broker_files / "ca.pem").is_file()


def test_prometheus_sends_the_monitors_read_token() -> None:
    [cluster_job] = [job for job in PROMETHEUS["scrape_configs"] if job["job_name"] == CLUSTER_JOB]
    token_file = cluster_job["authorization"]["credentials_file"]
    prometheus = COMPOSE["services"]["prometheus"]
    assert token_file in " ".join(prometheus["entrypoint"]) and "SHARDYARD_HTTP_READ_TOKEN" in prometheus["environment"]
    assert COMPOSE["services"]["monitor"]["environment"]["SHARDYARD_HTTP_READ_TOKEN"].startswith("${")
