"""`disan serve`: run the HTTP service on a bundle.

Every flag mirrors a field of `service.settings.Settings` (``--max-batch-size`` <->
``DISAN_MAX_BATCH_SIZE``); a flag given on the command line wins over the environment.
The flags are generated from the settings model so the CLI and the env variables cannot drift.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Literal, get_args, get_origin

from pydantic import ValidationError

from disan.manifest import BundleError, load_manifest
from service.settings import Settings

EXPORT_HINT = "disan export --nli CKPT --sentiment CKPT --out models/default"
# Seconds uvicorn waits for in-flight requests after SIGTERM before closing connections.
GRACEFUL_SHUTDOWN_S = 30


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

    import uvicorn  # imported late: `disan serve --help` and the checks above stay fast

    given = {k for k in vars(args) if k in Settings.model_fields}
    export_to_env(settings, given)
    uvicorn.run(
        "service.main:create_app_from_env",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=settings.log_level,
        access_log=settings.access_log,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        # X-Forwarded-* are not needed (client addresses only appear in the access log), and
        # uvicorn's proxy-headers middleware would run on every request.
        proxy_headers=False,
    )
    return 0
