"""`disan serve`: run the HTTP service on a bundle.

Every flag mirrors a field of `service.settings.Settings` (``--max-batch-size`` <->
``DISAN_MAX_BATCH_SIZE``); a flag given on the command line wins over the environment.
The flags are generated from the settings model so the CLI and the env variables cannot drift.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
from enum import Enum
from typing import Literal, get_args, get_origin

from pydantic import ValidationError

from disan.bundle.manifest import BundleError, load_manifest
from service.settings import Settings

EXPORT_HINT = "disan export --nli CKPT --sentiment CKPT --out models/default"
# After SIGTERM the app answers what is still waiting at `drain_timeout_s` (503, JSON); uvicorn's
# own deadline comes this much later, so it never cuts a request off with its plain-text 500 first.
UVICORN_AFTER_DRAIN_S = 1
# What the process may take after that: the batchers finish the onnxruntime calls already running
# (service.backend.model.STOP_GRACE_S) and the interpreter exits.
EXIT_AFTER_DRAIN_S = 4
HTTP_PROTOCOL = "service.http.protocol:DisanHttpToolsProtocol"


def shutdown_deadline_s(settings: Settings) -> float:
    """Seconds from SIGTERM until `disan serve` has exited, at most: what docker's
    stop_grace_period and Kubernetes' terminationGracePeriodSeconds (after preStop) must allow."""
    return settings.drain_timeout_s + UVICORN_AFTER_DRAIN_S + EXIT_AFTER_DRAIN_S


def flag_name(field: str) -> str:
    """Settings field -> command-line flag (``max_wait_ms`` -> ``--max-wait-ms``)."""
    return "--" + field.replace("_", "-")


def env_name(field: str) -> str:
    """Settings field -> environment variable (``max_wait_ms`` -> ``DISAN_MAX_WAIT_MS``)."""
    return "DISAN_" + field.upper()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per settings field; unset flags leave the env / default value alone."""
    for name, field in Settings.model_fields.items():
        default = "./models/default" if name == "bundle" else field.get_default(call_default_factory=True)
        shown = "unset" if default in (None, []) else default
        help_text = f"{field.description or name.replace('_', ' ')} (default: {shown}; env {env_name(name)})"
        kwargs: dict = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        if name == "cors_origins":
            kwargs.update(nargs="*", metavar="ORIGIN")
        elif get_origin(field.annotation) is Literal:
            kwargs["choices"] = get_args(field.annotation)
        elif isinstance(field.annotation, type) and issubclass(field.annotation, Enum):
            kwargs["choices"] = [member.value for member in field.annotation]
        elif field.annotation in (int, float):
            kwargs["metavar"] = "N"
        parser.add_argument(flag_name(name), **kwargs)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Environment + defaults, overridden by the flags actually given."""
    overrides = {k: v for k, v in vars(args).items() if k in Settings.model_fields}
    return Settings(**overrides)


def export_to_env(settings: Settings, given: dict) -> None:
    """Copy command-line overrides into DISAN_* so uvicorn worker processes see them too."""
    for name in given:
        value = getattr(settings, name)
        if name == "api_key":
            value = value.get_secret_value() if value is not None else ""
        elif isinstance(value, list):  # cors_origins, model_aliases: the comma form the settings read
            value = ",".join(value)
        os.environ[env_name(name)] = str(value)


def run(args: argparse.Namespace) -> int:
    """Validate settings and the bundle, then serve until SIGTERM/SIGINT (drains in-flight work)."""
    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "settings"
        print(f"disan serve: invalid setting {loc}: {first['msg']}", file=sys.stderr)
        return 2
    if not (settings.bundle / "manifest.json").is_file():
        print(f"disan serve: no model bundle at {settings.bundle}; create one with `{EXPORT_HINT}` "
              "or pass --bundle DIR (env DISAN_BUNDLE)", file=sys.stderr)
        return 2
    try:
        load_manifest(settings.bundle)
    except BundleError as exc:
        print(f"disan serve: unusable bundle: {exc}", file=sys.stderr)
        return 2
    if settings.otlp_endpoint is not None:
        # late, as uvicorn below; a missing `tracing` extra is one line before the server starts
        from service.http.tracing import require_sdk

        require_sdk()

    import uvicorn  # imported late: `disan serve --help` and the checks above stay fast

    from service.common.metrics import MULTIPROC_ENV  # late for the same reason (prometheus)

    given = {k for k in vars(args) if k in Settings.model_fields}
    export_to_env(settings, given)
    # Several workers share their metrics and readiness through a fresh directory (a tmpfs in the
    # containers, whose root is read-only); prometheus_client reads the variable at import, so it
    # is set before the workers start. One worker alone keeps its private registry.
    shared = tempfile.mkdtemp(prefix="disan-workers-") if settings.workers > 1 else None
    if shared is not None:
        os.environ[MULTIPROC_ENV] = shared
    else:
        os.environ.pop(MULTIPROC_ENV, None)
    try:
        uvicorn.run(
            "service.main:create_app_from_env",
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            log_level=settings.log_level,
            access_log=settings.access_log,
            # httptools with limits on the request head and the drain signal (service/http/protocol.py);
            # the h11 limit is set too, to the same value, for anyone who switches implementation.
            http=HTTP_PROTOCOL,
            h11_max_incomplete_event_size=settings.max_header_bytes,
            timeout_graceful_shutdown=math.ceil(settings.drain_timeout_s) + UVICORN_AFTER_DRAIN_S,
            # X-Forwarded-* are not needed (client addresses only appear in the access log), and
            # uvicorn's proxy-headers middleware would run on every request.
            proxy_headers=False,
        )
    finally:
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)
    return 0
