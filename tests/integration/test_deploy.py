"""The deployment files under deploy/: compose, Kubernetes manifests, Prometheus, Grafana.

- every YAML file parses (Kubernetes files are multi-document), the dashboard is JSON;
- the example deployments run two shards: two Redis primaries, per shard two dispatchers and a
  worker fleet per queue, each with `--shard i` of its name and every shard's URL in order;
  KEDA scales each fleet on its own shard's queue; Prometheus labels each target with its
  shard; every dashboard query is narrowed by the `shard` variable;
- every container of the project's image runs a `parley` subcommand that exists, with
  options click itself accepts (parsed with the container's environment), and sets only
  environment variables the code reads; images are the project's own (deploy/Dockerfile)
  or official redis / prometheus / grafana ones; metrics ports, probes and scrape targets
  agree with PARLEY_METRICS_PORT; every file a deployment file names exists;
- the dashboard's and the alert rules' queries name only metrics that a live dispatcher
  and worker expose on /metrics, after one seed session (so labelled series exist);
- the approvers' inbox (`parley inbox`) runs in both deployments: every shard's URL as its own
  login, submitting as the registered producer `inbox`, the users file and the keys file the
  dispatchers verify with mounted from secrets, a shared session secret on Kubernetes, probes
  and healthcheck on /healthz, scraped on its page's port; under that login, with the shipped
  ACL file, a live inbox signs a person in, lists, shows and answers an interrupt with an
  empty ACL LOG;
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
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import click
import httpx
import orjson
import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from parley.cli import cli
from parley.client import Client
from parley.runtime.procs import free_port, stop_process
from parley.schemas.keys import Keys
from parley.schemas.signing import parse_keys
from parley.web.observe import metrics_body
from parley.web.users import hash_password
from tests.conftest import Procs, eventually, wait_for
from tests.forkserver import start_parley
from tests.integration.test_acl import DISPATCHER, PRODUCER, WORKER, AclRedis

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "parley.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"

METRICS_PORT = 9100
#: the inbox serves its page, /metrics and /healthz on one port
INBOX_PORT = 8080
INBOX_PRODUCER = "inbox"
PROJECT_IMAGE = "parley"
OFFICIAL_IMAGES = {"redis", "prom/prometheus", "grafana/grafana"}
QUEUES = ("decide", "llm", "tools")
METRIC_TOKEN = re.compile(r"\bparley_[a-z0-9_]+")
ENV_READ = re.compile(r"""(?:envvar=|environ\.get\(|environ\[|getenv\()\s*["']([A-Z][A-Z0-9_]*)["']""")
#: `envvar=["A", "B"]`: an option read from the first of several variables
ENV_LIST = re.compile(r"envvar=\[([^\]]*)\]")
ENV_NAME = re.compile(r"""["']([A-Z][A-Z0-9_]*)["']""")
#: a per-shard service or Deployment is named <role>-<i>
SHARD_SUFFIX = re.compile(r"-([0-9]+)$")

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
            text = path.read_text()
            names |= set(ENV_READ.findall(text))
            for names_list in ENV_LIST.findall(text):
                names |= set(ENV_NAME.findall(names_list))
    return names


def compose_value(value: Any) -> str:
    """A compose environment value with `${VAR:-default}` replaced by its default."""
    return re.sub(r"\$\{[A-Z0-9_]+:?-([^}]*)\}", r"\1", str(value))


def check_parley_args(args: list[str], env: dict[str, str], where: str) -> str:
    """`args` follow the image's ENTRYPOINT ["parley"]: an existing subcommand whose options
    click parses (types and ranges included) with `env` as the environment. Returns it."""
    assert args, f"{where}: no command"
    sub = args[0]
    with click.Context(cli) as ctx:
        command = cli.get_command(ctx, sub)
        assert command is not None, f"{where}: `parley {sub}` is not a subcommand ({cli.list_commands(ctx)})"
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
    # the project itself, with the extras its own commands use (`parley agui`, traces)
    assert re.search(r'^RUN pip install "\.\[agui,otel\]"', text, re.M)
    assert 'ENTRYPOINT ["parley"]' in text
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["parley"] == "parley.cli:main"
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        for source in line.split()[:-1]:
            assert (ROOT / source).exists(), f"Dockerfile copies {source}, which does not exist"
    # parley/ is the package; its links (parley/schemas, ...) point at top-level folders, which
    # the image must copy too, or the links would dangle in the build
    folders = {"parley"} | {str((ROOT / "parley" / link.name).resolve().relative_to(ROOT))
                            for link in (ROOT / "parley").iterdir() if link.is_symlink()}
    assert folders == {"parley", "schemas", "dispatcher", "workers"}
    copied = set(re.findall(r"^COPY (\S+) \./\1$", text, re.M))
    assert folders <= copied, "the image must copy every folder the package is built from"
    # The default PARLEY_APP (the seed app) is not in the wheel: it must stay in the working
    # directory the processes run in, after the sources are removed.
    after_install = text[text.index("rm -rf /src"):]
    assert re.search(r"^WORKDIR /app$", after_install, re.M)
    assert after_install.index("WORKDIR /app") < after_install.index("COPY examples ./examples")


# ---- compose ------------------------------------------------------------------------------


def redis_urls(env: dict[str, str]) -> list[str]:
    """The shards' URLs a process is given, in order (PARLEY_REDIS_URLS, or one PARLEY_REDIS_URL)."""
    return str(env.get("PARLEY_REDIS_URLS") or env.get("PARLEY_REDIS_URL") or "").split()


def url_host(url: str) -> str:
    return re.sub(r"^redis://[^@]*@", "", url).split(":", 1)[0].split("/", 1)[0]


def compose_shards(services: dict[str, dict[str, Any]]) -> list[str]:
    """The Redis services of compose, in shard order (redis-0, redis-1, ...)."""
    names = sorted((n for n in services if re.fullmatch(r"redis-[0-9]+", n)), key=lambda n: int(n[6:]))
    assert names == [f"redis-{i}" for i in range(len(names))], names
    return names


def test_compose_services() -> None:
    compose = load(DEPLOY / "compose.yaml")
    services: dict[str, dict[str, Any]] = compose["services"]
    allowed_env = code_env_names()
    version = project_version()
    shards = compose_shards(services)
    assert len(shards) == 2, "the example deployment runs two shards"
    dispatchers: dict[int, int] = {}
    worker_queues: list[tuple[str, int]] = []
    for name, svc in services.items():
        repo, tag = split_image(svc["image"])
        for source in [v.split(":", 1)[0] for v in svc.get("volumes", []) if v.startswith(".")]:
            assert (DEPLOY / source).exists(), f"{name}: mounts {source}, which does not exist"
        if not is_project_image(svc["image"]):
            assert repo in OFFICIAL_IMAGES, f"{name}: image {svc['image']} is neither ours nor official"
            continue
        assert tag == version, f"{name}: image tag {tag} is not the project's version {version}"
        env = {k: compose_value(v) for k, v in svc["environment"].items()}
        assert set(env) <= allowed_env, f"{name}: env the code never reads: {set(env) - allowed_env}"
        # every process names every shard, in order
        urls = redis_urls(env)
        assert [url_host(u) for u in urls] == shards, f"{name}: URLs {urls} are not the shards in order"
        assert all(u.startswith("redis://") for u in urls)
        # files the command reads (click checks that they exist): the deploy/ files mounted there
        files = with_compose_files(compose, svc, env, name)
        sub = check_parley_args(svc["command"], files, f"compose {name}")
        if sub == "inbox":
            check_compose_inbox(compose, name, svc, env)
            continue
        if sub not in ("dispatcher", "worker", "notify"):
            # the producer: a one-shot command, not a long-running process to scrape
            assert svc.get("profiles"), f"{name}: an example producer is started only when asked"
            assert env.get("PARLEY_PRODUCER"), f"{name}: a producer submits as a registered producer"
            continue
        build = svc["build"]
        assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == (DEPLOY / "Dockerfile")
        assert env["PARLEY_METRICS_PORT"] == str(METRICS_PORT)
        suffix = SHARD_SUFFIX.search(name)
        shard = option_value(svc["command"], "--shard")
        if sub in ("dispatcher", "worker"):
            # a dispatcher or worker serves one shard, the one its service is named for
            assert suffix is not None and shard == suffix.group(1), \
                f"{name}: a per-shard service runs `--shard {suffix and suffix.group(1)}`, not {shard}"
            assert int(shard) < len(shards), f"{name}: --shard {shard} names no Redis service"
        replicas = int(svc.get("deploy", {}).get("replicas", 1))
        if sub == "dispatcher":
            dispatchers[int(str(shard))] = dispatchers.get(int(str(shard)), 0) + replicas
        if sub == "worker":
            queues = option_value(svc["command"], "--queues")
            assert queues in QUEUES, f"{name}: a fleet serves one queue, not {queues}"
            worker_queues.append((str(queues), int(str(shard))))
        assert [str(p) for p in svc["expose"]] == [str(METRICS_PORT)]
        assert f":{METRICS_PORT}/readyz" in " ".join(svc["healthcheck"]["test"])
        assert "ports" not in svc, f"{name}: fleets are scraped inside the network, not published"
    assert dispatchers == {i: 2 for i in range(len(shards))}, "two dispatchers per shard"
    assert sorted(worker_queues) == sorted((q, i) for q in QUEUES for i in range(len(shards))), \
        "per shard, one worker fleet per queue"
    producers = [n for n, svc in services.items() if is_project_image(svc["image"])
                 and svc["command"][0] not in ("dispatcher", "worker", "notify", "inbox")]
    assert [n for n, svc in services.items() if svc.get("command", [""])[0] == "inbox"] == ["inbox"]
    assert producers, "an app (producer) service, given every shard's URL"

    data_volumes = set()
    for shard in shards:
        redis_svc = services[shard]
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
        data_volumes |= {v.split(":")[0] for v in redis_svc["volumes"] if v.split(":")[1] == "/data"}
    assert len(data_volumes) == len(shards), "each shard keeps its AOF in a volume of its own"
    assert data_volumes <= set(compose["volumes"])
    # shard 0 keeps the volume of the one-Redis release (`redis-data`): an upgrade finds its
    # data there, where a new name would start shard 0 empty and orphan it
    shard0 = next(v.split(":")[0] for v in services["redis-0"]["volumes"] if v.split(":")[1] == "/data")
    assert shard0 == "redis-data"
    for name, svc in services.items():
        for url in redis_urls(svc.get("environment", {})):
            user, password = re.match(r"redis://([^:]+):([^@]+)@", url).groups()  # type: ignore[union-attr]
            assert f"user {user} on >{password} " in acl_text, f"{name}: {user}'s password is not the ACL's"


def compose_secret_path(compose: dict[str, Any], svc: dict[str, Any], path: str, where: str) -> Path:
    """The file of deploy/ a container reads at `path`: a Compose secret it is given
    (/run/secrets/<name>), whose file exists."""
    assert path.startswith("/run/secrets/"), f"{where}: {path} is not a secret's file"
    name = path.removeprefix("/run/secrets/")
    given = [s if isinstance(s, str) else s["source"] for s in svc.get("secrets", [])]
    assert name in given, f"{where}: reads {path} but is not given the secret {name}"
    source = DEPLOY / compose["secrets"][name]["file"]
    assert source.is_file(), f"{where}: secret {name}'s file {source} does not exist"
    return source.resolve()


def with_compose_files(compose: dict[str, Any], svc: dict[str, Any], env: dict[str, str],
                       where: str) -> dict[str, str]:
    """`env` with each file path of a secret the container is given replaced by the deploy/
    file the secret is made from (to parse the command where those files are)."""
    return {k: str(compose_secret_path(compose, svc, v, where)) if v.startswith("/run/secrets/") else v
            for k, v in env.items()}


def check_compose_inbox(compose: dict[str, Any], name: str, svc: dict[str, Any], env: dict[str, str]) -> None:
    """The inbox: its page (with /metrics and /healthz) on one published port, its healthcheck
    on /healthz, submitting as the registered producer `inbox`, the users file and the keys file
    the dispatchers verify with mounted as secrets."""
    where = f"compose {name}"
    build = svc["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == (DEPLOY / "Dockerfile")
    assert option_value(svc["command"], "--port") == str(INBOX_PORT), where
    assert option_value(svc["command"], "--host") == "0.0.0.0", f"{where}: reachable outside its container"
    assert [str(p) for p in svc["expose"]] == [str(INBOX_PORT)], where
    assert svc["ports"] == [f"127.0.0.1:{INBOX_PORT}:{INBOX_PORT}"], f"{where}: published on localhost"
    assert f"127.0.0.1:{INBOX_PORT}/healthz" in " ".join(svc["healthcheck"]["test"]), where
    assert "PARLEY_METRICS_PORT" not in env, f"{where}: /metrics is on the page's port"
    assert env["PARLEY_PRODUCER"] == INBOX_PRODUCER, where
    assert "--shard" not in svc["command"], f"{where}: the inbox serves every shard"
    # started when asked: it refuses to start while the users file names nobody, as shipped
    assert svc.get("profiles") == ["inbox"], where
    users = compose_secret_path(compose, svc, env["PARLEY_INBOX_USERS"], where)
    json.loads(users.read_text())
    keys = compose_secret_path(compose, svc, env["PARLEY_KEYS_FILE"], where)
    parse_keys(keys.read_text(), str(keys))
    assert "PARLEY_INBOX_SECRET" in env, f"{where}: the session secret comes from the environment"
    # the dispatchers verify what the inbox signs: the same keys file
    for other, osvc in compose["services"].items():
        if osvc.get("command", [""])[0] == "dispatcher":
            denv = {k: compose_value(v) for k, v in osvc["environment"].items()}
            assert compose_secret_path(compose, osvc, denv["PARLEY_KEYS_FILE"], other) == keys, other
            assert INBOX_PRODUCER in str(denv["PARLEY_REGISTER_PRODUCERS"]).split(), other


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


def test_kubernetes_workloads(tmp_path: Path) -> None:
    docs = k8s_docs()
    maps, secrets = _configmaps_and_secrets(docs)
    allowed_env = code_env_names()
    version = project_version()
    workers: dict[str, tuple[str, int]] = {}
    dispatchers: dict[int, int] = {}
    shard_count = len(redis_urls({"PARLEY_REDIS_URLS": secrets["parley-redis"]["dispatcher-urls"]}))
    assert shard_count == 2, "the example deployment runs two shards"
    inboxes: list[str] = []
    inbox_keys: tuple[str, str] | None = None
    dispatcher_keys: set[tuple[str, str]] = set()
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
                map_ref = e.get("valueFrom", {}).get("configMapKeyRef")
                if ref:
                    assert ref["key"] in secrets[ref["name"]], f"{where}: no secret key {ref}"
                    env[e["name"]] = str(secrets[ref["name"]][ref["key"]])
                elif map_ref:
                    assert map_ref["key"] in maps[map_ref["name"]], f"{where}: no ConfigMap key {map_ref}"
                    env[e["name"]] = maps[map_ref["name"]][map_ref["key"]]
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
            sub = check_parley_args(c["args"], with_k8s_files(pod, c, env, secrets, tmp_path, where), where)
            if sub == "inbox":
                inboxes.append(name)
                inbox_keys = check_k8s_inbox(d, c, env, secrets, shard_count, where)
                continue
            if sub == "dispatcher":
                dispatcher_keys.add(k8s_mounted_secret(pod, c, env["PARLEY_KEYS_FILE"], secrets, where))
            port = int(env["PARLEY_METRICS_PORT"])
            assert port == METRICS_PORT
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            assert ports == {"metrics": port}, where
            assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)
            assert pod["metadata"]["labels"]["app.kubernetes.io/part-of"] == "parley"
            for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                http = c[probe]["httpGet"]
                assert http["path"] == path and http["port"] in ("metrics", port), f"{where}: {probe}"
            urls = redis_urls(env)
            hosts = [f"redis-{i}.redis.parley.svc" for i in range(shard_count)]
            assert [url_host(u) for u in urls] == hosts, f"{where}: every shard's URL, in order"
            # a Deployment serves one shard: the one it is named and labelled for
            shard = option_value(c["args"], "--shard")
            suffix = SHARD_SUFFIX.search(name)
            assert suffix is not None and shard == suffix.group(1), f"{where}: `--shard` of its name"
            assert pod["metadata"]["labels"]["parley/shard"] == shard, f"{where}: the pod's shard label"
            assert d["spec"]["selector"]["matchLabels"]["parley/shard"] == shard, where
            assert int(shard) < shard_count, f"{where}: --shard {shard} names no URL"
            if sub == "dispatcher":
                dispatchers[int(shard)] = dispatchers.get(int(shard), 0) + d["spec"]["replicas"]
            else:
                assert sub == "worker", where
                queue = option_value(c["args"], "--queues")
                assert queue in QUEUES, f"{where}: a Deployment serves one queue, not {queue}"
                workers[name] = (str(queue), int(shard))
    assert dispatchers == {i: 2 for i in range(shard_count)}, "two dispatchers per shard"
    assert sorted(workers.values()) == sorted((q, i) for q in QUEUES for i in range(shard_count)), \
        "per shard, one worker Deployment per queue"
    # the inbox: one Deployment, its Service, and the keys file the dispatchers verify with
    assert inboxes == ["parley-inbox"], inboxes
    assert dispatcher_keys == {inbox_keys}, \
        f"dispatchers verify with {dispatcher_keys}, the inbox signs with {inbox_keys}"
    inbox_pod = next(d for d in docs if d["metadata"]["name"] == "parley-inbox"
                     and d["kind"] == "Deployment")["spec"]["template"]
    (service,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "parley-inbox"]
    assert service["spec"]["selector"].items() <= inbox_pod["metadata"]["labels"].items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    assert set(maps["parley-config"]["PARLEY_REGISTER_PRODUCERS"].split()) >= {INBOX_PRODUCER}
    pdbs = {d["spec"]["selector"]["matchLabels"].get("parley/shard") for d in docs
            if d["kind"] == "PodDisruptionBudget"
            and d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "dispatcher"}
    assert pdbs == {str(i) for i in range(shard_count)}, "a PodDisruptionBudget per shard's dispatchers"
    (inbox_pdb,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"
                    and d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "inbox"]
    assert inbox_pdb["spec"]["selector"]["matchLabels"].items() <= inbox_pod["metadata"]["labels"].items()

    redis_sts = next(d for d in docs if d["kind"] == "StatefulSet")
    assert redis_sts["spec"]["volumeClaimTemplates"], "Redis needs a PersistentVolume for its AOF"
    redis_c = redis_sts["spec"]["template"]["spec"]["containers"][0]
    assert "/data" in {m["mountPath"] for m in redis_c["volumeMounts"]}
    assert "--aclfile" in redis_c["args"]
    # one pod per shard (redis-0, redis-1: independent primaries, each with its own volume)
    assert redis_sts["metadata"]["name"] == "redis" and redis_sts["spec"]["replicas"] == shard_count
    # the one-Redis release's StatefulSet, upgraded in place: a field Kubernetes refuses to
    # change on an existing StatefulSet must keep its old value (the default)
    assert redis_sts["spec"].get("podManagementPolicy", "OrderedReady") == "OrderedReady"
    # and its claim's name: pod redis-0 mounts the one-Redis release's PersistentVolume
    assert [t["metadata"]["name"] for t in redis_sts["spec"]["volumeClaimTemplates"]] == ["data"]

    # KEDA: each worker Deployment scaled on its own RQ queue's list.
    scaled = {d["spec"]["scaleTargetRef"]["name"]: d for d in docs if d["kind"] == "ScaledObject"}
    assert set(scaled) == set(workers)
    auths = {d["metadata"]["name"]: d for d in docs if d["kind"] == "TriggerAuthentication"}
    prefix = maps["parley-config"]["PARLEY_PREFIX"]
    for deployment, (queue, shard_index) in workers.items():
        (trigger,) = scaled[deployment]["spec"]["triggers"]
        assert trigger["type"] == "redis"
        # each fleet scales on its own shard's queue
        assert trigger["metadata"]["address"] == f"redis-{shard_index}.redis.parley.svc:6379", deployment
        assert trigger["metadata"]["listName"] == f"rq:queue:{Keys(prefix).queue(queue)}"
        assert int(trigger["metadata"]["listLength"]) > 0
        auth = auths[trigger["authenticationRef"]["name"]]
        for ref in auth["spec"]["secretTargetRef"]:
            assert ref["key"] in secrets[ref["name"]]


def k8s_mounted_secret(pod: dict[str, Any], container: dict[str, Any], path: str,
                       secrets: dict[str, dict[str, str]], where: str) -> tuple[str, str]:
    """(Secret, key) of the file a container reads at `path`: a whole Secret volume mounted at
    the file's folder (no subPath: a Secret updated later reaches the pod), holding the key."""
    folder, _, key = path.rpartition("/")
    mounts = [m for m in container.get("volumeMounts", []) if m["mountPath"].rstrip("/") == folder]
    mount = mounts[0] if len(mounts) == 1 else None
    assert mount is not None, f"{where}: nothing is mounted at {folder} (for {path})"
    assert "subPath" not in mount, f"{where}: {path} through subPath is never updated"
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    secret = volume["secret"]["secretName"]
    assert key in secrets[secret], f"{where}: Secret {secret} has no key {key} (for {path})"
    return secret, key


def with_k8s_files(pod: dict[str, Any], container: dict[str, Any], env: dict[str, str],
                   secrets: dict[str, dict[str, str]], tmp: Path, where: str) -> dict[str, str]:
    """`env` with each path of a file the container has mounted from a Secret replaced by a copy
    of that Secret's key written under `tmp` (to parse the command where those files are)."""
    folders = {m["mountPath"].rstrip("/") for m in container.get("volumeMounts", [])
               if any(v["name"] == m["name"] and "secret" in v for v in pod["spec"].get("volumes", []))}
    out = dict(env)
    for name, value in env.items():
        if value.rpartition("/")[0] in folders:
            secret, key = k8s_mounted_secret(pod, container, value, secrets, where)
            copy = tmp / secret / key
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(secrets[secret][key])
            out[name] = str(copy)
    return out


def check_k8s_inbox(d: dict[str, Any], c: dict[str, Any], env: dict[str, str],
                    secrets: dict[str, dict[str, str]], shard_count: int, where: str) -> tuple[str, str]:
    """The inbox's Deployment: its page port (with /metrics and /healthz) scraped and probed,
    every shard's URL as login parley-inbox, submitting as producer `inbox`, the session secret
    from a Secret (the replicas share it), the users and keys files mounted from Secrets.
    Returns the (Secret, key) of its keys file."""
    pod = d["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert labels["app.kubernetes.io/part-of"] == "parley", where
    assert labels["app.kubernetes.io/component"] == "inbox", where
    assert "parley/shard" not in labels, f"{where}: the inbox serves every shard"
    assert option_value(c["args"], "--port") == str(INBOX_PORT), where
    assert option_value(c["args"], "--host") == "0.0.0.0", where
    assert "--secure-cookies" in c["args"], f"{where}: behind TLS, the cookie goes over HTTPS only"
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": INBOX_PORT}, where
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(INBOX_PORT), where
    assert annotations["prometheus.io/path"] == "/metrics", where
    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/healthz")):
        http = c[probe]["httpGet"]
        assert http["path"] == path and http["port"] in ("http", INBOX_PORT), f"{where}: {probe}"
    assert "PARLEY_METRICS_PORT" not in env, f"{where}: /metrics is on the page's port"
    assert env["PARLEY_PRODUCER"] == INBOX_PRODUCER, where
    urls = redis_urls(env)
    assert [url_host(u) for u in urls] == [f"redis-{i}.redis.parley.svc" for i in range(shard_count)], where
    acl_text = (DEPLOY / "redis" / "users.acl").read_text()
    for url in urls:
        user, password = re.match(r"redis://([^:]+):([^@]+)@", url).groups()  # type: ignore[union-attr]
        assert user == "parley-inbox" and f"user {user} on >{password} " in acl_text, f"{where}: {url}"
    (secret_env,) = [e for e in c["env"] if e["name"] == "PARLEY_INBOX_SECRET"]
    assert "secretKeyRef" in secret_env.get("valueFrom", {}), f"{where}: the session secret, from a Secret"
    assert d["spec"]["replicas"] >= 2, f"{where}: replicas, sharing the session secret"
    users, users_key = k8s_mounted_secret(pod, c, env["PARLEY_INBOX_USERS"], secrets, where)
    json.loads(secrets[users][users_key])
    keys = k8s_mounted_secret(pod, c, env["PARLEY_KEYS_FILE"], secrets, where)
    parse_keys(secrets[keys[0]][keys[1]], where)
    return keys


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_renders() -> None:
    out = subprocess.run(["kubectl", "kustomize", str(DEPLOY)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(out.stdout) if d)
    # per shard (two): a dispatcher Deployment, three worker Deployments and their ScaledObjects;
    # and the inbox's Deployment
    assert kinds.count("Deployment") == 9 and kinds.count("ScaledObject") == 6 and "StatefulSet" in kinds
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    # kustomize renames generated Secrets (a hash suffix) and the references to them; the keys
    # file keeps its name, so a rotation updates it in place (the pods read it again)
    secret_names = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    assert "parley-keys" in secret_names
    for d in docs:
        if d["kind"] == "Deployment":
            for v in d["spec"]["template"]["spec"].get("volumes", []):
                if "secret" in v:
                    assert v["secret"]["secretName"] in secret_names, (d["metadata"]["name"], v)


# ---- Prometheus and Grafana ---------------------------------------------------------------


def test_prometheus_scrapes_every_process_on_the_metrics_port() -> None:
    config = load(DEPLOY / "prometheus" / "prometheus.yml")
    services = load(DEPLOY / "compose.yaml")["services"]
    parley_services = {n for n, s in services.items() if is_project_image(s["image"])
                       and s["command"][0] in ("dispatcher", "worker", "notify", "inbox")}
    scraped: set[str] = set()
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            # the inbox serves /metrics on its page's port
            expected = INBOX_PORT if sd["names"] == ["inbox"] else METRICS_PORT
            assert sd["port"] == expected, job["job_name"]
            scraped |= set(sd["names"])
        if any(SHARD_SUFFIX.search(n) for sd in job.get("dns_sd_configs", []) for n in sd["names"]):
            # per-shard targets get shard="<i>" from their name, the label their series carry
            # (honor_labels: kept as the process serves it, not renamed exported_shard)
            assert job.get("honor_labels") is True, job["job_name"]
            (rule,) = [r for r in job["relabel_configs"] if r.get("target_label") == "shard"]
            assert rule["source_labels"] == ["__meta_dns_name"]
            for sd in job["dns_sd_configs"]:
                for n in sd["names"]:
                    assert re.fullmatch(rule["regex"], n) and re.sub(f"^{rule['regex']}$", r"\1", n) \
                        == SHARD_SUFFIX.search(n).group(1), n  # type: ignore[union-attr]
    assert scraped == parley_services
    for rule_file in config["rule_files"]:
        assert (DEPLOY / "prometheus" / rule_file).is_file()
    k8s = load(DEPLOY / "prometheus" / "prometheus-k8s.yml")
    relabels = k8s["scrape_configs"][0]["relabel_configs"]
    # kept: the port named `metrics` of any pod, and the inbox's page port `http`
    port_name = "__meta_kubernetes_pod_container_port_name"
    (keep,) = [r for r in relabels if r.get("action") == "keep" and port_name in r["source_labels"]]
    assert keep["source_labels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_component",
                                     "__meta_kubernetes_pod_container_port_name"]
    for component, port, kept in (("dispatcher", "metrics", True), ("worker", "metrics", True),
                                  ("inbox", "http", True), ("dispatcher", "http", False),
                                  ("worker", "redis", False), ("inbox", "other", False)):
        assert bool(re.fullmatch(keep["regex"], f"{component};{port}")) is kept, (component, port)
    assert k8s["scrape_configs"][0].get("honor_labels") is True
    assert any(r.get("target_label") == "shard" and r["source_labels"]
               == ["__meta_kubernetes_pod_label_parley_shard"] for r in relabels)


def test_alert_rules() -> None:
    rules = {r["alert"]: r for r in alert_rules()}
    assert set(rules) == {"ParleyConsumerLagGrowing", "ParleyInterruptOpenTooLong", "ParleyDecisionsFailing",
                          "ParleyInboxErrors", "ParleyInboxAnswersUnconfirmed"}
    assert "parley_stream_lag" in rules["ParleyConsumerLagGrowing"]["expr"]
    assert "parley_oldest_open_interrupt_age_seconds" in rules["ParleyInterruptOpenTooLong"]["expr"]
    assert "parley_decisions_failed_total" in rules["ParleyDecisionsFailing"]["expr"]
    assert "parley_inbox_requests_total" in rules["ParleyInboxErrors"]["expr"]
    assert "parley_inbox_answers_total" in rules["ParleyInboxAnswersUnconfirmed"]["expr"]
    assert all(r.get("for") for r in rules.values())


SHARD_MATCHER = 'shard=~"$shard"'


def test_the_dashboard_has_a_shard_variable_every_query_uses() -> None:
    """Every series of a process of one shard carries shard="<i>": the dashboard's `shard`
    variable (several, or All, which also matches a deployment of one Redis: no label) narrows
    every panel, and the gauges read from Redis are taken per shard, then summed."""
    dash = json.loads(DASHBOARD.read_text())
    (var,) = [v for v in dash["templating"]["list"] if v["name"] == "shard"]
    assert var["type"] == "query" and var["includeAll"] and var["multi"]
    assert var["allValue"] == ".*", "All must match series without a shard label too"
    assert "label_values(" in var["definition"] and ", shard)" in var["definition"]
    queries = dashboard_exprs()
    assert queries
    for where, expr in queries:
        selectors = re.findall(r"\b(?:parley_[a-z0-9_]+|up)(\{[^}]*\})?", expr)
        assert selectors, where
        for sel in selectors:
            assert SHARD_MATCHER in sel, f"{where}: {expr!r} is not narrowed by $shard"
    for gauge in ("parley_open_interrupts", "parley_parked_branches", "parley_held_decisions"):
        for where, expr in queries:
            if gauge in expr:
                assert f"sum(max by (shard) ({gauge}" in expr, f"{where}: {expr!r} (one value per shard)"
    for where, expr in queries:
        for per in ("stream", "queue"):
            if f"max by ({per})" in expr or f"max by (shard, {per})" in expr:
                assert f"max by (shard, {per})" in expr, f"{where}: each shard has its own {per}s"


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
    """Every metric name a process exposes on /metrics."""
    return metric_names(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())


def metric_names(text: str) -> set[str]:
    """Every metric name of a Prometheus text exposition: families (declared even before a
    labelled series exists), their samples, and the `_total` / `_bucket` / `_count` / `_sum` forms."""
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
    # the inbox's /metrics: its own registry (the live inbox's is checked under its login below)
    exposed |= metric_names(metrics_body()[0].decode())
    assert "parley_inbox_answers_total" in exposed
    queries = all_queries()
    assert len(queries) >= 20
    missing = {(where, name) for where, expr in queries for name in METRIC_TOKEN.findall(expr)
               if name not in exposed}
    assert not missing, f"queries name metrics the processes do not expose: {sorted(missing)}"


# ---- the inbox under its own login --------------------------------------------------------


def acl_password(user: str) -> str:
    """The placeholder password users.acl ships for `user`."""
    for line in (DEPLOY / "redis" / "users.acl").read_text().splitlines():
        if line.startswith(f"user {user} "):
            return re.search(r" >(\S+)", line).group(1)  # type: ignore[union-attr]
    raise AssertionError(f"users.acl has no user {user}")


class Page(HTMLParser):
    """What this test reads of a page: the hidden inputs of each form (by the form's id), the
    `data-status` of `#outcome`, and the sessions of the list's rows."""

    def __init__(self, html: str):
        super().__init__()
        self.forms: dict[str, dict[str, str]] = {}
        self.outcome: str | None = None
        self.rows: list[str] = []
        self._form: str | None = None
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self._form = a.get("id", "")
            self.forms.setdefault(self._form, {})
        elif tag == "input" and self._form is not None and a.get("type") == "hidden":
            self.forms[self._form][a.get("name", "")] = a.get("value", "")
        if a.get("id") == "outcome":
            self.outcome = a.get("data-status")
        if tag == "tr" and "interrupt" in a.get("class", "").split():
            self.rows.append(a.get("data-session", ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._form = None


@pytest.mark.e2e
def test_the_inbox_answers_under_its_own_login_with_nothing_refused(tmp_path: Path) -> None:
    """The deployment's inbox: login parley-inbox of the shipped users.acl, producer `inbox`
    registered by the dispatcher, the keys file the dispatcher verifies with. A person signs in,
    sees the open interrupt, opens it and approves it: delivered; a new one reaches the page
    live; and Redis refused nothing to anyone (ACL LOG empty)."""
    acl = AclRedis(tmp_path / "redis")
    keys, users = tmp_path / "keys.json", tmp_path / "inbox-users.json"
    keys.write_text(json.dumps({"alice": "alice-signing-key-0123456789"}))
    users.write_text(json.dumps({"alice": {"password": hash_password("alice-password")}}))
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    base = {"PARLEY_APP": "examples.seed_app", "PYTHONPATH": path, "PARLEY_LOG_LEVEL": "INFO"}
    port = free_port()
    procs = [
        start_parley(["dispatcher", "--keys-file", str(keys)],
                     {**base, "PARLEY_REDIS_URL": acl.url(DISPATCHER, acl_password(DISPATCHER)),
                      "PARLEY_REGISTER_PRODUCERS": "app inbox"}, tmp_path / "dispatcher.log"),
        start_parley(["worker"], {**base, "PARLEY_REDIS_URL": acl.url(WORKER, acl_password(WORKER))},
                     tmp_path / "worker.log"),
        start_parley(["--producer", INBOX_PRODUCER, "inbox", "--port", str(port), "--users-file", str(users),
                      "--keys-file", str(keys)],
                     {**base, "PARLEY_REDIS_URL": acl.url("parley-inbox", acl_password("parley-inbox"))},
                     tmp_path / "inbox.log"),
    ]
    try:
        producer = Client(acl.connect(PRODUCER, acl_password(PRODUCER)), producer="app")

        def sent() -> bool:  # once the dispatcher has loaded the submit function
            try:
                producer.send("deploy-inbox-1", {"type": "message.create",
                                                 "content": "Email bob@example.com: the launch moved."})
                return True
            except Exception:
                return False

        eventually(sent, timeout=20)
        wait_for(producer, "deploy-inbox-1", lambda e: e["type"] == "interrupt.raised")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=20) as web:
            eventually(lambda: _inbox_healthy(web), timeout=20)
            form = Page(web.get("/signin").text).forms["signin"]
            signed = web.post("/signin", data={**form, "principal": "alice", "secret": "alice-password"})
            assert signed.status_code == 303, signed.text[:500]
            assert Page(web.get("/").text).rows == ["deploy-inbox-1"]
            page = web.get("/interrupt", params={"session": "deploy-inbox-1", "id": "int-1"})
            assert page.status_code == 200, (acl.denials(), page.text[-1500:])
            answer = Page(page.text).forms["answer"]
            assert answer["session"] == "deploy-inbox-1" and answer["interrupt_id"] == "int-1"
            done = web.post("/interrupt/answer", data={**answer, "decision": "approve"})
            assert done.status_code == 200 and Page(done.text).outcome == "delivered", done.text[-2000:]
            # live updates: the feed read under this login, the new row rendered from the index
            with web.stream("GET", "/events") as events:
                assert events.status_code == 200
                producer.send("deploy-inbox-2", {"type": "message.create",
                                                 "content": "Email carol@example.com: the launch moved."})
                lines = events.iter_lines()  # (an earlier `gone` may come first)
                deadline = time.monotonic() + 20  # a comment line comes every 15 s at least
                for line in lines:
                    if line == "event: raised":
                        break
                    assert time.monotonic() < deadline, "no `raised` event on the page's stream"
                assert '"deploy-inbox-2"' in next(lines)
            metrics = web.get("/metrics").text
            assert 'parley_inbox_answers_total{outcome="delivered"} 1.0' in metrics
            # every inbox metric the alert rules name is served
            named = {m for _where, expr in all_queries() for m in METRIC_TOKEN.findall(expr)}
            assert {m for m in named if m.startswith("parley_inbox_")} <= metric_names(metrics)
        resumed = wait_for(producer, "deploy-inbox-1", lambda e: e["type"] == "interrupt.resumed")[-1]
        assert resumed["principal"] == "alice"
        wait_for(producer, "deploy-inbox-1", lambda e: e["type"] == "turn.completed")
        assert acl.denials() == []
    except BaseException:
        for log in sorted(tmp_path.glob("*.log")):
            print(f"----- {log.name} -----\n{log.read_text(errors='replace')[-3000:]}")
        raise
    finally:
        for proc in procs:
            stop_process(proc)
        acl.stop()


@pytest.mark.parametrize("attempt", [
    pytest.param(lambda r: r.xadd("parley:in:app", {"session": "s", "input": "{}"}), id="another-producer"),
    pytest.param(lambda r: r.xadd("parley:inputs", {"session": "s", "input": "{}"}), id="the-shared-stream"),
    pytest.param(lambda r: r.hincrby("parley:in:inbox", "x", 1), id="its-stream-as-another-type"),
    pytest.param(lambda r: r.xadd("parley:pending:inbox", {"x": "1"}), id="its-pending-hash-as-a-stream"),
    pytest.param(lambda r: r.xgroup_create("parley:feed", "mine", id="$"), id="a-group-on-the-feed"),
    pytest.param(lambda r: r.xadd("parley:feed", {"event": "{}"}), id="write-the-feed"),
    pytest.param(lambda r: r.hset("parley:{s-1}:meta", "core", "{}"), id="write-a-session"),
    pytest.param(lambda r: r.xadd("parley:{s-1}:events", {"event": "{}"}), id="write-events"),
    pytest.param(lambda r: r.zadd("parley:interrupts", {"s-1/int-1": 1}), id="write-the-index"),
    pytest.param(lambda r: r.zrange("parley:sessions:parked", 0, -1), id="the-list-of-sessions"),
    pytest.param(lambda r: r.get("parley:engine:key"), id="the-engines-key"),
    pytest.param(lambda r: r.hgetall("parley:producers"), id="the-producer-registry"),
    pytest.param(lambda r: r.hset("parley:keyprints", "d-1", "{}"), id="write-the-key-fingerprints"),
    pytest.param(lambda r: r.eval("return 1", 0), id="eval"),
    pytest.param(lambda r: r.llen("rq:queue:decide"), id="rq"),
    pytest.param(lambda r: r.keys("*"), id="keys"),
    pytest.param(lambda r: r.config_get("requirepass"), id="config"),
])
def test_the_inbox_login_is_refused_the_rest(tmp_path: Path, attempt: Any) -> None:
    """parley-inbox reads what the page shows and submits as producer `inbox`; nothing else."""
    acl = AclRedis(tmp_path / "redis")
    try:
        inbox = acl.connect("parley-inbox", acl_password("parley-inbox"))
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt(inbox)
        assert {user for user, _why, _obj in acl.denials()} == {"parley-inbox"}
    finally:
        acl.stop()


@pytest.mark.parametrize("attempt", [
    pytest.param(lambda r: r.xadd("parley:in:app", {"session": "s", "input": "{}"}), id="another-producer"),
    pytest.param(lambda r: r.xadd("parley:in:inbox", {"session": "s", "input": "{}"}), id="the-inbox"),
    pytest.param(lambda r: r.xadd("parley:inputs", {"session": "s", "input": "{}"}), id="the-shared-stream"),
    pytest.param(lambda r: r.hincrby("parley:in:agui", "x", 1), id="its-stream-as-another-type"),
    pytest.param(lambda r: r.hset("parley:{s-1}:meta", "core", "{}"), id="write-a-session"),
    pytest.param(lambda r: r.hset("parley:{s-1}:msgs", "m", "{}"), id="write-messages"),
    pytest.param(lambda r: r.xadd("parley:{s-1}:events", {"event": "{}"}), id="write-events"),
    pytest.param(lambda r: r.xadd("parley:{s-1}:deltas", {"text": "forged"}), id="write-deltas"),
    pytest.param(lambda r: r.hset("parley:interrupts:info", "s-1/int-1", "{}"), id="write-the-index"),
    pytest.param(lambda r: r.xread({"parley:feed": "0-0"}), id="the-feed"),
    pytest.param(lambda r: r.get("parley:inbox:signin:x"), id="the-inbox-sign-ins"),
    pytest.param(lambda r: r.get("parley:engine:key"), id="the-engines-key"),
    pytest.param(lambda r: r.hgetall("parley:producers"), id="the-producer-registry"),
    pytest.param(lambda r: r.get("parley:jobtoken:x"), id="a-job-token"),
    pytest.param(lambda r: r.hdel("parley:keyprints", "d-1"), id="erase-the-key-fingerprints"),
    pytest.param(lambda r: r.eval("return 1", 0), id="eval"),
    pytest.param(lambda r: r.lpush("rq:queue:tools", "x"), id="rq"),
    pytest.param(lambda r: r.keys("*"), id="keys"),
    pytest.param(lambda r: r.config_get("requirepass"), id="config"),
])
def test_the_agui_login_is_refused_the_rest(tmp_path: Path, attempt: Any) -> None:
    """parley-agui reads sessions, their token streams and the interrupts' details, and submits
    as producer `agui`; it cannot write what the engine keeps, nor reach the inbox's or the
    workers' keys."""
    acl = AclRedis(tmp_path / "redis")
    try:
        agui = acl.connect("parley-agui", acl_password("parley-agui"))
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt(agui)
        assert {user for user, _why, _obj in acl.denials()} == {"parley-agui"}
    finally:
        acl.stop()


def _inbox_healthy(web: httpx.Client) -> bool:
    try:
        return web.get("/healthz").status_code == 200
    except httpx.TransportError:
        return False


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
    services = load(DEPLOY / "compose.yaml")["services"]
    dispatchers = [svc for svc in services.values() if svc.get("command", [""])[0] == "dispatcher"]
    assert len(dispatchers) == 2
    for svc in dispatchers:
        assert set(str(svc["environment"]["PARLEY_REGISTER_PRODUCERS"]).split()) == wanted
    maps, _secrets = _configmaps_and_secrets(k8s_docs())
    assert set(maps["parley-config"]["PARLEY_REGISTER_PRODUCERS"].split()) == wanted
