"""Kubernetes manifests cannot drift from the code.

No cluster runs in CI. kubernetes-validate checks every manifest in deploy/k8s offline against the
Kubernetes API schemas it ships, strictly (an unknown or misspelt field fails), for the oldest
Kubernetes the manifests need and the newest it knows; the ServiceMonitor is a CRD with no schema
there, so it gets a structural check. Then what the manifests use is checked against the code:
every DISAN_* variable is a field of `service.settings.Settings` and the pod's whole environment
(image ENV < ConfigMap < container env) validates, probes and the scrape path are GET routes the
app serves without an API key, ports agree, the grace period outlasts preStop plus the service's
drain deadline, images and the non-root user match the Dockerfiles and compose, and the Service,
HPA and PDB select the Deployment's pods. The kustomizations only list files, so the test renders
them itself; where kubectl is installed it also checks that `kubectl kustomize` agrees.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from service import cli as serve_cli
from service.settings import Settings

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
VARIANTS = ("cpu", "gpu")
COMPOSE_SERVICE = {"gpu": "disan", "cpu": "disan-cpu"}  # docker-compose.yml service per variant
PROVIDERS = {"gpu": "cuda", "cpu": "cpu"}
# The preStop `sleep` action is on by default from Kubernetes 1.30.
MIN_KUBERNETES = "1.30"
CRD_KINDS = {"ServiceMonitor"}  # kinds kubernetes-validate has no schema for (checked below)
SETTINGS_ENV = {serve_cli.env_name(name) for name in Settings.model_fields}
ENV_NAME = re.compile(r"\bDISAN_[A-Z0-9_]*[A-Z0-9]\b")
QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
SUFFIX = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def drain_deadline_s() -> float:
    """Seconds `disan serve` may take from SIGTERM to exit (drain deadline + finishing up)."""
    return serve_cli.shutdown_deadline_s(Settings())


# ----------------------------------------------------------------------------------- loading
def load_docs(path: Path) -> list[dict]:
    """Every non-empty YAML document of a file."""
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def manifest_files() -> list[Path]:
    files = sorted(K8S.rglob("*.yaml"))
    assert files, f"no manifests under {K8S}"
    return files


def kustomize(directory: Path) -> list[dict]:
    """Render a kustomization that only lists resources (what `kubectl kustomize` would output)."""
    (kustomization,) = load_docs(directory / "kustomization.yaml")
    extra = set(kustomization) - {"apiVersion", "kind", "resources"}
    assert not extra, f"{directory}: {sorted(extra)} would change the files; this test renders " \
                      "only `resources` (teach it, or keep the kustomization a plain list)"
    docs: list[dict] = []
    for entry in kustomization["resources"]:
        target = (directory / entry).resolve()
        assert target.exists(), f"{directory / 'kustomization.yaml'}: {entry} does not exist"
        docs += kustomize(target) if target.is_dir() else load_docs(target)
    return docs


def variant(name: str) -> dict[str, dict]:
    """The rendered variant, one document per kind (each variant has one of each)."""
    docs = kustomize(K8S / name)
    kinds = [doc["kind"] for doc in docs]
    assert len(kinds) == len(set(kinds)), f"{name}: duplicate kinds {kinds}"
    return {doc["kind"]: doc for doc in docs}


def pod_spec(name: str) -> dict:
    return variant(name)["Deployment"]["spec"]["template"]["spec"]


def container(name: str) -> dict:
    (only,) = pod_spec(name)["containers"]
    return only


def quantity(value: object) -> float:
    """A Kubernetes resource quantity ("2", "500m", "1Gi", 1) as a number."""
    match = QUANTITY.match(str(value))
    assert match, f"unsupported quantity {value!r}"
    return float(match.group(1)) * SUFFIX[match.group(2)]


def open_get_paths(tmp_path: Path) -> set[str]:
    """GET routes that answer something other than 401 without a key when an API key is set."""
    main = pytest.importorskip("service.main")
    testclient = pytest.importorskip("fastapi.testclient")
    app = main.create_app(Settings(bundle=tmp_path, api_key="k8s-test-key"))  # no lifespan: no bundle
    paths = [path for path, ops in app.openapi()["paths"].items() if "get" in ops]
    client = testclient.TestClient(app)
    return {path for path in paths if client.get(path).status_code != 401}


def http_port(name: str) -> dict:
    (port,) = [p for p in container(name)["ports"] if p.get("name") == "http"]
    return port


def probe_port(name: str, probe: dict) -> int:
    """The container port a probe hits (named or numeric)."""
    port = probe["httpGet"]["port"]
    if isinstance(port, str):
        (match,) = [p for p in container(name)["ports"] if p.get("name") == port]
        return match["containerPort"]
    return port


def final_stage(path: Path) -> list[dict]:
    """Instructions of a Dockerfile's last stage."""
    parser = pytest.importorskip("dockerfile_parse").DockerfileParser(path=str(path))
    structure = parser.structure
    last_from = max(i for i, ins in enumerate(structure) if ins["instruction"] == "FROM")
    return structure[last_from:]


def dockerfile(name: str) -> Path:
    return ROOT / "docker" / f"service-{name}.Dockerfile"


def image_env(name: str) -> dict[str, str]:
    """DISAN_* variables the image sets (its final stage)."""
    envs = pytest.importorskip("dockerfile_parse").DockerfileParser(path=str(dockerfile(name))).envs
    return {k: v for k, v in envs.items() if k.startswith("DISAN_")}


def compose_services() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))["services"]


def pod_env(name: str) -> dict[str, str | None]:
    """The DISAN_* environment the container sees: image ENV < envFrom ConfigMaps < env.

    Values from a resourceFieldRef are what the kubelet puts there (the quantity divided by the
    divisor, rounded up); an optional Secret reference counts as unset (the Secret may not exist).
    """
    rendered = variant(name)
    spec = container(name)
    env: dict[str, str | None] = dict(image_env(name))
    for source in spec.get("envFrom", []):
        assert set(source) == {"configMapRef"}, f"unexpected envFrom {source}"
        config_map = rendered["ConfigMap"]
        assert source["configMapRef"]["name"] == config_map["metadata"]["name"], \
            "envFrom names the ConfigMap the kustomization ships"
        unknown = set(config_map["data"]) - SETTINGS_ENV
        assert not unknown, f"ConfigMap keys that are not service settings: {sorted(unknown)}"
        env.update(config_map["data"])
    for var in spec.get("env", []):
        source = var.get("valueFrom")
        if source is None:
            env[var["name"]] = var["value"]
        elif "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            assert ref["containerName"] == spec["name"], "resourceFieldRef names this container"
            kind, resource = ref["resource"].split(".", 1)
            value = quantity(spec["resources"][kind][resource]) / quantity(ref.get("divisor", "1"))
            env[var["name"]] = str(math.ceil(value))
        elif "secretKeyRef" in source:
            assert source["secretKeyRef"].get("optional") is True, \
                f"{var['name']}: the Secret is optional, so the manifests apply without it"
            env[var["name"]] = None
        else:
            raise AssertionError(f"{var['name']}: unexpected valueFrom {source}")
    unknown = {k for k in env if k.startswith("DISAN_")} - SETTINGS_ENV
    assert not unknown, f"not service settings: {sorted(unknown)}"
    return env


def settings_for(name: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings built from exactly the pod's DISAN_* environment, as the container would."""
    env = pod_env(name)
    for var in SETTINGS_ENV:
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        if value is not None:
            monkeypatch.setenv(var, value)
    return Settings()


# ---------------------------------------------------------------------------- schema checks
@pytest.mark.parametrize("version", [MIN_KUBERNETES, "latest"])
def test_kubernetes_validate(version: str) -> None:
    """Every manifest validates strictly against the API schemas (CRDs aside, see below)."""
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed "
                             "(pip install -e '.[dev]')")
    version = kv.latest_version() if version == "latest" else version
    errors, kinds = [], set()
    for path in manifest_files():
        for doc in load_docs(path):
            if doc.get("kind") == "Kustomization" or doc.get("kind") in CRD_KINDS:
                continue
            kinds.add(doc["kind"])
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as exc:
                where = ".".join(str(p) for p in exc.path)
                errors.append(f"{path.relative_to(ROOT)} {doc['kind']}: {where}: {exc.message}")
            except kv.SchemaNotFoundError as exc:
                errors.append(f"{path.relative_to(ROOT)}: {exc.message}")
    assert not errors, "\n".join(errors)
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
            "ConfigMap"} <= kinds


def test_servicemonitor_selects_the_services(tmp_path: Path) -> None:
    """Structural check of the CRD: it selects both Services, by a port they name, on /metrics."""
    (monitor,) = load_docs(K8S / "servicemonitor.yaml")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "ServiceMonitor"
    assert set(monitor["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    wanted = monitor["spec"]["selector"]["matchLabels"]
    open_paths = open_get_paths(tmp_path)
    for name in VARIANTS:
        service = variant(name)["Service"]
        assert wanted.items() <= service["metadata"]["labels"].items(), f"misses the {name} Service"
        port_names = {p["name"] for p in service["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}
            assert endpoint["port"] in port_names
            assert endpoint["path"] in open_paths, "scrape path is an open GET route"
            assert re.fullmatch(r"\d+[smh]", endpoint["interval"])


# --------------------------------------------------------------------------- layout checks
def test_kustomizations_list_every_file() -> None:
    for directory in sorted({p.parent for p in K8S.rglob("kustomization.yaml")}):
        (kustomization,) = load_docs(directory / "kustomization.yaml")
        assert kustomization["kind"] == "Kustomization"
        listed = {(directory / entry).resolve() for entry in kustomization["resources"]}
        present = {p.resolve() for p in directory.glob("*.yaml") if p.name != "kustomization.yaml"}
        assert present <= listed, f"{directory}: not in kustomization.yaml: {sorted(present - listed)}"
    for name in VARIANTS:
        assert (K8S / "base").resolve() in {(K8S / name / e).resolve()
                                           for e in load_docs(K8S / name / "kustomization.yaml")[0]
                                           ["resources"]}


@pytest.mark.parametrize("name", VARIANTS)
def test_kubectl_kustomize_agrees(name: str) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed (optional: the test renders the kustomizations itself)")
    done = subprocess.run([kubectl, "kustomize", str(K8S / name)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr

    def key(doc: dict) -> tuple[str, str]:
        return doc["kind"], doc["metadata"]["name"]
    rendered = sorted((d for d in yaml.safe_load_all(done.stdout) if d), key=key)
    assert rendered == sorted(kustomize(K8S / name), key=key)


def test_every_disan_variable_is_a_setting() -> None:
    """Any DISAN_* name in the manifests (comments included) is a field of Settings."""
    used = {m for f in manifest_files() for m in ENV_NAME.findall(f.read_text(encoding="utf-8"))}
    assert used and used <= SETTINGS_ENV, f"unknown DISAN_* variables: {sorted(used - SETTINGS_ENV)}"


# --------------------------------------------------------------------- deployment vs code
@pytest.mark.parametrize("name", VARIANTS)
def test_pod_environment_is_valid_settings(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_for(name, monkeypatch)
    assert settings.host == "0.0.0.0", "a pod must listen on all interfaces"
    assert http_port(name)["containerPort"] == settings.port, "containerPort is DISAN_PORT"
    assert settings.providers == PROVIDERS[name]
    # One worker per pod: replicas scale out, and /ready, /metrics then describe the whole pod.
    assert settings.workers == 1
    cpus = quantity(container(name)["resources"]["limits"]["cpu"])
    if name == "cpu":
        # auto concurrency counts the node's cores (sched_getaffinity), not the pod's CPU quota.
        assert settings.batch_concurrency >= 1, "batch_concurrency is set, not auto"
        threads = settings.workers * settings.batch_concurrency * max(settings.intra_op_threads, 1)
        assert threads <= math.ceil(cpus), f"{threads} ORT threads on a {cpus}-CPU limit"
    else:
        assert 1 <= settings.intra_op_threads <= math.ceil(cpus), "ORT threads fit the CPU limit"
    assert settings.api_key is None, "no key unless the optional Secret exists"
    spec = container(name)
    keys = [var["name"] for var in spec["env"] if "secretKeyRef" in var.get("valueFrom", {})]
    assert keys == ["DISAN_API_KEY"], "the API key (and only it) comes from a Secret"


@pytest.mark.parametrize("name", VARIANTS)
def test_probes_and_scraping_hit_open_routes(name: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    spec = container(name)
    probes = {kind: spec[kind] for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"]["httpGet"]["path"] == "/health"
    assert probes["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert probes["startupProbe"]["httpGet"]["path"] == "/ready", "started = loaded and warmed up"
    open_paths = open_get_paths(tmp_path)
    port = settings_for(name, monkeypatch).port
    for kind, probe in probes.items():
        assert probe["httpGet"]["path"] in open_paths, f"{kind}: not an open GET route"
        assert probe_port(name, probe) == port, f"{kind} probes the port the service listens on"
    # The startup budget is at least compose's start_period for the same image.
    start_period = compose_services()[COMPOSE_SERVICE[name]]["healthcheck"]["start_period"]
    startup = probes["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= float(start_period.rstrip("s"))
    annotations = variant(name)["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] in open_paths
    assert int(annotations["prometheus.io/port"]) == port


@pytest.mark.parametrize("name", VARIANTS)
def test_graceful_termination_outlasts_the_drain(name: str) -> None:
    pod = pod_spec(name)
    pre_stop = container(name)["lifecycle"]["preStop"]
    assert set(pre_stop) == {"sleep"}, "preStop sleeps until the endpoint removal has propagated"
    sleep_s = pre_stop["sleep"]["seconds"]
    assert sleep_s > 0
    # Kubernetes counts the grace period from the start of preStop; SIGTERM comes after it.
    assert pod["terminationGracePeriodSeconds"] > sleep_s + drain_deadline_s(), \
        "the kubelet would SIGKILL the pod before `disan serve` finishes draining"


@pytest.mark.parametrize("name", VARIANTS)
def test_non_root_hardening_matches_the_image(name: str) -> None:
    pod, spec = pod_spec(name), container(name)
    user = next(ins["value"] for ins in reversed(final_stage(dockerfile(name)))
                if ins["instruction"] == "USER")
    uid, _, gid = user.partition(":")
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert str(pod["securityContext"]["runAsUser"]) == uid != "0", "the image's numeric USER"
    assert str(pod["securityContext"].get("runAsGroup", gid)) == (gid or uid)
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    # Service links inject <SERVICE>_PORT=tcp://...; a Service named `disan` would set DISAN_PORT.
    assert pod["enableServiceLinks"] is False
    context = spec["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert not context.get("privileged")
    volumes = {v["name"]: v for v in pod["volumes"]}
    tmp = [m for m in spec["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert tmp and "emptyDir" in volumes[tmp[0]["name"]], "/tmp is a writable emptyDir"


@pytest.mark.parametrize("name", VARIANTS)
def test_images_match_dockerfiles_and_compose(name: str) -> None:
    image = container(name)["image"]
    service = compose_services()[COMPOSE_SERVICE[name]]
    assert service["build"]["dockerfile"] == f"docker/service-{name}.Dockerfile"
    assert image == service["image"], "the tag compose builds"
    header = dockerfile(name).read_text(encoding="utf-8")
    assert f"docker build -f docker/service-{name}.Dockerfile -t {image} ." in header


@pytest.mark.parametrize("name", VARIANTS)
def test_resources_and_gpu(name: str) -> None:
    resources = container(name)["resources"]
    for resource in ("cpu", "memory"):
        assert quantity(resources["requests"][resource]) <= quantity(resources["limits"][resource])
    gpus = resources["limits"].get("nvidia.com/gpu")
    if name == "gpu":
        assert gpus is not None and quantity(gpus) == 1, "one GPU per pod"
        assert resources.get("requests", {}).get("nvidia.com/gpu", gpus) == gpus
    else:
        assert gpus is None and "nvidia.com/gpu" not in resources.get("requests", {})


@pytest.mark.parametrize("name", VARIANTS)
def test_service_hpa_pdb_select_the_deployment(name: str) -> None:
    rendered = variant(name)
    deployment = rendered["Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service, pdb = rendered["Service"], rendered["PodDisruptionBudget"]
    hpa = rendered["HorizontalPodAutoscaler"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    target = port["targetPort"]
    assert target in (http_port(name)["name"], http_port(name)["containerPort"])
    # A budget that allows no disruption would block node drains forever.
    assert pdb["spec"].get("maxUnavailable", 0) >= 1
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    for metric in hpa["spec"]["metrics"]:
        if metric["type"] == "Resource":
            resource = metric["resource"]["name"]
            assert resource in container(name)["resources"]["requests"], \
                f"utilization of {resource} is relative to its request, which must be set"
