"""The deployment files under deploy/: compose, Kubernetes manifests, Prometheus, Grafana.

- every YAML file parses (Kubernetes files are multi-document), the dashboard is JSON;
- every container of the project's image runs a `parley` subcommand that exists, with
  options click itself accepts (parsed with the container's environment), and sets only
  environment variables the code reads; images are the project's own (deploy/Dockerfile)
  or official redis / prometheus / grafana ones; metrics ports, probes and scrape targets
  agree with PARLEY_METRICS_PORT; every file a deployment file names exists;
- the dashboard's and the alert rules' queries name only metrics that a live dispatcher
  and worker expose on /metrics, after one seed session (so labelled series exist);
- with promtool installed (Debian: `apt-get install prometheus`): the rules and the
  compose scrape config check, the alert rules' unit tests pass and every dashboard query
  parses; with kubectl installed: `kubectl kustomize deploy` renders.
"""

import json
import os
import re
import shutil
import subprocess
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import orjson
import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from parley.cli import cli
from parley.cli.procs import free_port
from parley.client import Client
from parley.schemas.keys import Keys
from tests.conftest import Procs, eventually, wait_for

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "parley.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"

METRICS_PORT = 9100
PROJECT_IMAGE = "parley"
OFFICIAL_IMAGES = {"redis", "prom/prometheus", "grafana/grafana"}
QUEUES = ("decide", "llm", "tools")
METRIC_TOKEN = re.compile(r"\bparley_[a-z0-9_]+")
ENV_READ = re.compile(r"""(?:envvar=|environ\.get\(|environ\[|getenv\()\s*["']([A-Z][A-Z0-9_]*)["']""")

# ---- helpers ------------------------------------------------------------------------------


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def k8s_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def project_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def split_image(image: str) -> tuple[str, str]:
    repo, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
    return repo, tag


def is_project_image(image: str) -> bool:
    return split_image(image)[0] == PROJECT_IMAGE


def code_env_names() -> set[str]:
    """Environment variables the code reads: click `envvar=` and os.environ/getenv lookups."""
    names: set[str] = set()
    for package in ("parley", "dispatcher", "workers", "schemas"):
        for path in (ROOT / package).rglob("*.py"):
            names |= set(ENV_READ.findall(path.read_text()))
    return names


def compose_value(value: Any) -> str:
    """A compose environment value with `${VAR:-default}` replaced by its default."""
    return re.sub(r"\$\{[A-Z0-9_]+:?-([^}]*)\}", r"\1", str(value))


def check_parley_args(args: list[str], env: dict[str, str], where: str) -> str:
    """`args` follow the image's ENTRYPOINT ["parley"]: an existing subcommand whose options
    click parses (types and ranges included) with `env` as the environment. Returns it."""
    assert args, f"{where}: no command"
    sub = args[0]
    assert sub in cli.commands, f"{where}: `parley {sub}` is not a subcommand ({sorted(cli.commands)})"
    command = cli.commands[sub]
    known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    for token in args[1:]:
        if token.startswith("--"):
            assert token.split("=", 1)[0] in known, f"{where}: `parley {sub}` has no option {token}"
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if n.startswith("PARLEY_")]:
            mp.delenv(name)
        for name, value in env.items():
            mp.setenv(name, value)
        try:
            command.make_context(sub, list(args[1:]))
        except click.ClickException as exc:
            pytest.fail(f"{where}: `parley {' '.join(args)}` does not parse: {exc.format_message()}")
    return sub


def option_value(args: list[str], option: str) -> str | None:
    for i, token in enumerate(args):
        if token == option and i + 1 < len(args):
            return args[i + 1]
        if token.startswith(option + "="):
            return token.split("=", 1)[1]
    return None


def dashboard_exprs() -> list[tuple[str, str]]:
    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    dash = json.loads(DASHBOARD.read_text())
    return [(f"dashboard panel {p['title']!r}", t["expr"])
            for p in panels(dash["panels"]) for t in p.get("targets", []) if t.get("expr")]


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load(ALERTS)["groups"] for rule in group["rules"]]


def all_queries() -> list[tuple[str, str]]:
    return dashboard_exprs() + [(f"alert {r['alert']}", r["expr"]) for r in alert_rules()]


# ---- every file parses --------------------------------------------------------------------


def test_every_yaml_and_json_file_parses() -> None:
    files = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
    assert len(files) >= 10, files
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs and all(isinstance(d, dict) for d in docs), f"{path}: not YAML mappings"
    for path in DEPLOY.rglob("*.json"):
        json.loads(path.read_text())


def test_dockerfile_builds_the_project_with_parley_as_entrypoint() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\s*$", text, re.M)
    assert re.search(r"^RUN pip install \.", text, re.M)
    assert 'ENTRYPOINT ["parley"]' in text
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["parley"] == "parley.cli:main"
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        for source in line.split()[:-1]:
            assert (ROOT / source).exists(), f"Dockerfile copies {source}, which does not exist"
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    copied = set(re.findall(r"^COPY (\S+) \./\1$", text, re.M))
    assert set(folders.values()) <= copied, "the image must copy every folder the package is built from"
    # The default PARLEY_APP (the seed app) is not in the wheel: it must stay in the working
    # directory the processes run in, after the sources are removed.
    after_install = text[text.index("rm -rf /src"):]
    assert re.search(r"^WORKDIR /app$", after_install, re.M)
    assert after_install.index("WORKDIR /app") < after_install.index("COPY examples ./examples")


# ---- compose ------------------------------------------------------------------------------


def test_compose_services() -> None:
    compose = load(DEPLOY / "compose.yaml")
    services: dict[str, dict[str, Any]] = compose["services"]
    allowed_env = code_env_names()
    version = project_version()
    subcommands: dict[str, int] = {}
    worker_queues: list[str] = []
    for name, svc in services.items():
        repo, tag = split_image(svc["image"])
        for source in [v.split(":", 1)[0] for v in svc.get("volumes", []) if v.startswith(".")]:
            assert (DEPLOY / source).exists(), f"{name}: mounts {source}, which does not exist"
        if not is_project_image(svc["image"]):
            assert repo in OFFICIAL_IMAGES, f"{name}: image {svc['image']} is neither ours nor official"
            continue
        assert tag == version, f"{name}: image tag {tag} is not the project's version {version}"
        build = svc["build"]
        assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == (DEPLOY / "Dockerfile")
        env = {k: compose_value(v) for k, v in svc["environment"].items()}
        assert set(env) <= allowed_env, f"{name}: env the code never reads: {set(env) - allowed_env}"
        assert env["PARLEY_METRICS_PORT"] == str(METRICS_PORT)
        assert env["PARLEY_REDIS_URL"].startswith("redis://")
        sub = check_parley_args(svc["command"], env, f"compose {name}")
        replicas = int(svc.get("deploy", {}).get("replicas", 1))
        subcommands[sub] = subcommands.get(sub, 0) + replicas
        if sub == "worker":
            queues = option_value(svc["command"], "--queues")
            assert queues in QUEUES, f"{name}: a fleet serves one queue, not {queues}"
            worker_queues.append(queues)
        assert [str(p) for p in svc["expose"]] == [str(METRICS_PORT)]
        assert f":{METRICS_PORT}/readyz" in " ".join(svc["healthcheck"]["test"])
        assert "ports" not in svc, f"{name}: fleets are scraped inside the network, not published"
    assert subcommands.get("dispatcher", 0) >= 2, "two dispatchers"
    assert sorted(worker_queues) == sorted(QUEUES), "one worker fleet per queue"

    redis_svc = services["redis"]
    command = redis_svc["command"]
    conf = next(v.split(":")[0] for v in redis_svc["volumes"] if v.split(":")[1] == command[1])
    conf_text = (DEPLOY / conf).read_text()
    assert re.search(r"^appendonly yes", conf_text, re.M)
    assert re.search(r"^appendfsync always", conf_text, re.M)
    acl_target = option_value(command, "--aclfile")
    acl = next(v.split(":")[0] for v in redis_svc["volumes"] if v.split(":")[1] == acl_target)
    acl_text = (DEPLOY / acl).read_text()
    for role in ("producer", "worker", "dispatcher"):
        assert f"user parley-{role} " in acl_text
    for name, svc in services.items():
        url = svc.get("environment", {}).get("PARLEY_REDIS_URL")
        if url:
            user, password = re.match(r"redis://([^:]+):([^@]+)@", url).groups()  # type: ignore[union-attr]
            assert f"user {user} on >{password} " in acl_text, f"{name}: {user}'s password is not the ACL's"


# ---- Kubernetes ---------------------------------------------------------------------------


def _configmaps_and_secrets(docs: list[dict[str, Any]]) -> tuple[dict[str, dict[str, str]],
                                                                   dict[str, dict[str, str]]]:
    maps = {d["metadata"]["name"]: {k: str(v) for k, v in d.get("data", {}).items()}
            for d in docs if d["kind"] == "ConfigMap"}
    secrets = {d["metadata"]["name"]: {**d.get("data", {}), **d.get("stringData", {})}
               for d in docs if d["kind"] == "Secret"}
    kustomization = load(DEPLOY / "kustomization.yaml")
    for gen in kustomization.get("configMapGenerator", []):
        maps[gen["name"]] = {Path(f).name: (DEPLOY / f).read_text() for f in gen["files"]}
    for gen in kustomization.get("secretGenerator", []):
        secrets[gen["name"]] = {Path(f).name: (DEPLOY / f).read_text() for f in gen["files"]}
    return maps, secrets


def test_kustomization_names_every_manifest_and_file() -> None:
    kustomization = load(DEPLOY / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == sorted(f"k8s/{p.name}" for p in K8S.glob("*.yaml"))
    for gen in [*kustomization.get("configMapGenerator", []), *kustomization.get("secretGenerator", [])]:
        for f in gen["files"]:
            assert (DEPLOY / f).is_file(), f
    assert {i["name"] for i in kustomization["images"]} == {PROJECT_IMAGE}


def test_kubernetes_workloads() -> None:
    docs = k8s_docs()
    maps, secrets = _configmaps_and_secrets(docs)
    allowed_env = code_env_names()
    version = project_version()
    workers: dict[str, str] = {}
    dispatchers = 0
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        name = d["metadata"]["name"]
        pod = d["spec"]["template"]
        assert d["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        for c in pod["spec"]["containers"]:
            where = f"k8s {name}/{c['name']}"
            repo, tag = split_image(c["image"])
            env: dict[str, str] = {}
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets[ref["name"]], f"{where}: no secret key {ref}"
                    env[e["name"]] = "redis://ref:ref@redis:6379/0"
                else:
                    env[e["name"]] = str(e["value"])
            for source in c.get("envFrom", []):
                if "configMapRef" in source:
                    env.update(maps[source["configMapRef"]["name"]])
                if "secretRef" in source:
                    env.update(secrets[source["secretRef"]["name"]])
            for mount in c.get("volumeMounts", []):
                assert mount["name"] in volumes or mount["name"] in {
                    t["metadata"]["name"] for t in d["spec"].get("volumeClaimTemplates", [])}, where
            for vol in volumes.values():
                if "configMap" in vol:
                    assert vol["configMap"]["name"] in maps, f"{where}: no ConfigMap {vol}"
                if "secret" in vol:
                    assert vol["secret"]["secretName"] in secrets, f"{where}: no Secret {vol}"
            resources = c["resources"]["requests"]
            assert "cpu" in resources and "memory" in resources, f"{where}: resource requests"
            assert c.get("livenessProbe") and c.get("readinessProbe"), f"{where}: probes"
            if not is_project_image(c["image"]):
                assert repo in OFFICIAL_IMAGES, f"{where}: image {c['image']} is neither ours nor official"
                continue
            assert tag == version, f"{where}: image tag {tag} is not {version}"
            assert c.get("command") in (None, ["parley"]), f"{where}: the image's entrypoint is parley"
            assert set(env) <= allowed_env, f"{where}: env the code never reads: {set(env) - allowed_env}"
            sub = check_parley_args(c["args"], env, where)
            port = int(env["PARLEY_METRICS_PORT"])
            assert port == METRICS_PORT
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            assert ports == {"metrics": port}, where
            assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)
            assert pod["metadata"]["labels"]["app.kubernetes.io/part-of"] == "parley"
            for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                http = c[probe]["httpGet"]
                assert http["path"] == path and http["port"] in ("metrics", port), f"{where}: {probe}"
            if sub == "dispatcher":
                dispatchers += d["spec"]["replicas"]
            else:
                assert sub == "worker", where
                queue = option_value(c["args"], "--queues")
                assert queue in QUEUES, f"{where}: a Deployment serves one queue, not {queue}"
                workers[name] = queue
    assert dispatchers >= 2
    assert sorted(workers.values()) == sorted(QUEUES), "one worker Deployment per queue"

    redis_sts = next(d for d in docs if d["kind"] == "StatefulSet")
    assert redis_sts["spec"]["volumeClaimTemplates"], "Redis needs a PersistentVolume for its AOF"
    redis_c = redis_sts["spec"]["template"]["spec"]["containers"][0]
    assert "/data" in {m["mountPath"] for m in redis_c["volumeMounts"]}
    assert "--aclfile" in redis_c["args"]

    # KEDA: each worker Deployment scaled on its own RQ queue's list.
    scaled = {d["spec"]["scaleTargetRef"]["name"]: d for d in docs if d["kind"] == "ScaledObject"}
    assert set(scaled) == set(workers)
    auths = {d["metadata"]["name"]: d for d in docs if d["kind"] == "TriggerAuthentication"}
    prefix = maps["parley-config"]["PARLEY_PREFIX"]
    for deployment, queue in workers.items():
        (trigger,) = scaled[deployment]["spec"]["triggers"]
        assert trigger["type"] == "redis"
        assert trigger["metadata"]["listName"] == f"rq:queue:{Keys(prefix).queue(queue)}"
        assert int(trigger["metadata"]["listLength"]) > 0
        auth = auths[trigger["authenticationRef"]["name"]]
        for ref in auth["spec"]["secretTargetRef"]:
            assert ref["key"] in secrets[ref["name"]]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_renders() -> None:
    out = subprocess.run(["kubectl", "kustomize", str(DEPLOY)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(out.stdout) if d)
    assert kinds.count("Deployment") == 4 and kinds.count("ScaledObject") == 3 and "StatefulSet" in kinds


# ---- Prometheus and Grafana ---------------------------------------------------------------


def test_prometheus_scrapes_every_process_on_the_metrics_port() -> None:
    config = load(DEPLOY / "prometheus" / "prometheus.yml")
    services = load(DEPLOY / "compose.yaml")["services"]
    parley_services = {n for n, s in services.items() if is_project_image(s["image"])}
    scraped: set[str] = set()
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            assert sd["port"] == METRICS_PORT, job["job_name"]
            scraped |= set(sd["names"])
    assert scraped == parley_services
    for rule_file in config["rule_files"]:
        assert (DEPLOY / "prometheus" / rule_file).is_file()
    k8s = load(DEPLOY / "prometheus" / "prometheus-k8s.yml")
    relabels = k8s["scrape_configs"][0]["relabel_configs"]
    port_name = ["__meta_kubernetes_pod_container_port_name"]
    assert any(r.get("regex") == "metrics" and r["source_labels"] == port_name for r in relabels)


def test_alert_rules() -> None:
    rules = {r["alert"]: r for r in alert_rules()}
    assert set(rules) == {"ParleyConsumerLagGrowing", "ParleyInterruptOpenTooLong", "ParleyDecisionsFailing"}
    assert "parley_stream_lag" in rules["ParleyConsumerLagGrowing"]["expr"]
    assert "parley_oldest_open_interrupt_age_seconds" in rules["ParleyInterruptOpenTooLong"]["expr"]
    assert "parley_decisions_failed_total" in rules["ParleyDecisionsFailing"]["expr"]
    assert all(r.get("for") for r in rules.values())


def test_grafana_provisioning_finds_the_dashboard() -> None:
    services = load(DEPLOY / "compose.yaml")["services"]
    mounts = dict(v.split(":")[:2] for v in services["grafana"]["volumes"] if v.startswith("."))
    provisioning = DEPLOY / next(s for s, t in mounts.items() if t == "/etc/grafana/provisioning")
    (provider,) = load(provisioning / "dashboards" / "parley.yaml")["providers"]
    dashboards_dir = next(s for s, t in mounts.items() if t == provider["options"]["path"])
    assert (DEPLOY / dashboards_dir / DASHBOARD.name).is_file()
    (source,) = load(provisioning / "datasources" / "prometheus.yaml")["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert "prometheus" in services
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "parley"
    # What the dashboard must show: interrupts open and resumed, parked branches, held
    # decisions, throughput, job latency, lag.
    named = {m for _where, expr in dashboard_exprs() for m in METRIC_TOKEN.findall(expr)}
    assert {"parley_open_interrupts", "parley_interrupts_resumed_total", "parley_parked_branches",
            "parley_held_decisions", "parley_transitions_total", "parley_jobs_total",
            "parley_job_seconds_bucket", "parley_stream_lag"} <= named


# ---- the queries against a live scrape ----------------------------------------------------


def live_metric_names(port: int) -> set[str]:
    """Every metric name a process exposes: families (declared even before a labelled series
    exists), their samples, and the `_total` / `_bucket` / `_count` / `_sum` forms."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names |= {s.name for s in family.samples}
        if family.type == "counter":
            names |= {family.name + "_total", family.name + "_created"}
        elif family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_count", "_sum", "_created")}
    return names


def _up(port: int) -> bool:
    try:
        return int(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).status) == 200
    except OSError:
        return False


@pytest.mark.e2e
def test_queries_name_only_metrics_a_live_scrape_exposes(procs: Procs, r: redis.Redis,
                                                         client: Client) -> None:
    dport, wport = free_port(), free_port()
    procs.dispatcher("examples.seed_app", "--metrics-port", str(dport))
    procs.worker("examples.seed_app", "--metrics-port", str(wport))
    eventually(lambda: _up(dport) and _up(wport), timeout=10)
    # One seed session end to end, so labelled series (jobs, interrupts, inputs) exist.
    r.xadd("parley:inputs", {"session": "deploy-1", "input": orjson.dumps(
        {"type": "message.create", "content": "Email bob@example.com: the launch moved."})})
    wait_for(client, "deploy-1", lambda e: e["type"] == "interrupt.raised")
    r.xadd("parley:inputs", {"session": "deploy-1", "input": orjson.dumps(
        {"type": "interrupt.resume", "interrupt_id": "int-1", "payload": {"approved": True}})})
    wait_for(client, "deploy-1", lambda e: e["type"] == "turn.completed")
    time.sleep(0.3)
    exposed = live_metric_names(dport) | live_metric_names(wport)
    assert "parley_stream_lag" in exposed and "parley_job_seconds_bucket" in exposed
    queries = all_queries()
    assert len(queries) >= 20
    missing = {(where, name) for where, expr in queries for name in METRIC_TOKEN.findall(expr)
               if name not in exposed}
    assert not missing, f"queries name metrics the processes do not expose: {sorted(missing)}"


# ---- promtool -----------------------------------------------------------------------------

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed "
                                    "(Debian: apt-get install --no-install-recommends prometheus)")


def promtool(*args: str) -> str:
    assert PROMTOOL is not None
    out = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, check=False)
    assert out.returncode == 0, f"promtool {' '.join(args)}:\n{out.stdout}\n{out.stderr}"
    return out.stdout


@needs_promtool
def test_promtool_checks_rules_config_and_rule_tests() -> None:
    promtool("check", "rules", str(ALERTS))
    # prometheus-k8s.yml is not checked: Debian's promtool is built without kubernetes_sd_configs.
    promtool("check", "config", str(DEPLOY / "prometheus" / "prometheus.yml"))
    promtool("test", "rules", str(DEPLOY / "prometheus" / "alerts.test.yml"))


@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    rules = [{"record": f"parley_dashboard:query_{i}",
              "expr": expr.replace("$__rate_interval", "1m").replace("$__interval", "1m")}
             for i, (_where, expr) in enumerate(dashboard_exprs())]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    promtool("check", "rules", str(path))


def acl_producers() -> set[str]:
    """The producers deploy/redis/users.acl gives a login to, as `NAME` or `NAME=TENANT`: the
    streams `parley:in:NAME` a login may write, scoped to the tenant of the metas it may read."""
    out = set()
    for line in (DEPLOY / "redis" / "users.acl").read_text().splitlines():
        names = set(re.findall(r"~parley:in:([a-z0-9_-]+)(?:\s|\)|$)", line))
        if not names:
            continue
        tenants = set(re.findall(r"parley:\{([A-Za-z0-9._-]+)/\*\}:meta", line))
        assert len(names) == 1 and len(tenants) <= 1, line
        out.add(names.pop() + (f"={tenants.pop()}" if tenants else ""))
    return out


def test_the_deployments_register_the_producers_the_acl_file_has_logins_for() -> None:
    """A producer's inputs are read only once it is registered: compose's dispatchers and the
    Kubernetes config register exactly the producers users.acl has logins for."""
    wanted = acl_producers()
    assert wanted >= {"app"}, wanted
    compose = load(DEPLOY / "compose.yaml")["services"]["dispatcher"]["environment"]
    assert set(str(compose["PARLEY_REGISTER_PRODUCERS"]).split()) == wanted
    maps, _secrets = _configmaps_and_secrets(k8s_docs())
    assert set(maps["parley-config"]["PARLEY_REGISTER_PRODUCERS"].split()) == wanted
