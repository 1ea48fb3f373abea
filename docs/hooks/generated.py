"""MkDocs hook: the pages generated from the code at build time, so they cannot drift from it.

- configuration.md: the marker `<!-- generated: settings -->` becomes a table of every field of
  `service.settings.Settings`: its `DISAN_*` variable, `disan serve` flag, default, allowed values
  and description, grouped by the `# --- section ---` comments of service/settings.py.
- api-reference.md: the marker `<!-- generated: openapi -->` becomes every route with its request
  and response fields, read from the app's own OpenAPI schema (`create_app(...).openapi()`), which
  is also published beside the pages as openapi.json.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
# The checkout being documented, ahead of any installed copy of the packages: an editable install
# of another checkout would otherwise document that one's settings and routes.
sys.path.insert(0, str(ROOT))

from service.cli import env_name, flag_name  # noqa: E402
from service.main import create_app  # noqa: E402
from service.settings import Settings  # noqa: E402

SETTINGS_MARKER = "<!-- generated: settings -->"
OPENAPI_MARKER = "<!-- generated: openapi -->"
OPENAPI_FILE = "openapi.json"
_SECTION = re.compile(r"^\s*# --- (.+?)(?: \(.*\))? ---\s*$")
_FIELD = re.compile(r"^    (\w+): ")


def cell(text: Any) -> str:
    """A value fit for one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


# ------------------------------------------------------------------ settings
def settings_sections() -> dict[str, str]:
    """Field name -> the `# --- section ---` comment above it in service/settings.py."""
    section, found = "general", {}
    for line in (ROOT / "service" / "settings.py").read_text(encoding="utf-8").splitlines():
        if match := _SECTION.match(line):
            section = match.group(1)
        elif (match := _FIELD.match(line)) and match.group(1) in Settings.model_fields:
            found[match.group(1)] = section
    return found


def default_text(name: str, field: Any) -> str:
    if name == "bundle":  # a default_factory: the shipped bundle, wherever the checkout is
        return "`./models/default`"
    value = field.get_default(call_default_factory=True)
    if value is None or value == []:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def values_text(field: Any) -> str:
    """What the field accepts: choices, a bounded number, a list, a secret."""
    annotation = field.annotation
    if get_origin(annotation) is Literal:
        return ", ".join(f"`{choice}`" for choice in get_args(annotation))
    if annotation is bool:
        return "`true`, `false`"
    bounds = []
    for rule in field.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(rule, attr, None) is not None:
                bounds.append(f"{sign} {getattr(rule, attr):,}")
    kind = {int: "integer", float: "number", str: "text", Path: "path"}.get(annotation)
    if kind is None:
        text = str(annotation)
        kind = ("list: JSON or comma-separated" if "list" in text else
                "secret text" if "SecretStr" in text else "text")
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def settings_markdown() -> str:
    """Every setting, one table per section of service/settings.py."""
    sections = settings_sections()
    missing = sorted(set(Settings.model_fields) - set(sections))
    if missing:
        raise PluginError(f"settings without a section in service/settings.py: {missing}")
    out: list[str] = []
    for section in dict.fromkeys(sections.values()):
        title = section if section.startswith("onnxruntime") else section[0].upper() + section[1:]
        out += ["", f"### {title}", "",
                "| variable / flag | default | values | what |", "| --- | --- | --- | --- |"]
        for name, field in Settings.model_fields.items():
            if sections[name] == section:
                what = field.description or name.replace("_", " ")
                out.append(f"| `{env_name(name)}`<br>`{flag_name(name)}` | {default_text(name, field)} | "
                           f"{cell(values_text(field))} | {cell(what)} |")
    return "\n".join(out).strip() + "\n"


# ------------------------------------------------------------------- OpenAPI
@contextlib.contextmanager
def without_disan_env() -> Iterator[None]:
    """The schema of the defaults, whatever DISAN_* variables the building shell has."""
    saved = {k: os.environ.pop(k) for k in [k for k in os.environ if k.startswith("DISAN_")]}
    try:
        yield
    finally:
        os.environ.update(saved)


@functools.cache
def openapi_schema() -> dict[str, Any]:
    with without_disan_env():
        return create_app(Settings()).openapi()  # builds the routes only: no bundle is loaded


def type_text(schema: dict[str, Any] | bool) -> str:
    """A JSON-schema type in a few words, components linked to their section below."""
    if isinstance(schema, bool):  # `additionalProperties: true`: anything
        return "any"
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(type_text(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " or ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if schema.get("type") == "array":
        return f"list of {type_text(schema.get('items', {}))}"
    if schema.get("type") == "object" and "additionalProperties" in schema:
        return f"map to {type_text(schema['additionalProperties'])}"
    return schema.get("type", "any")


def fields_table(schema: dict[str, Any]) -> list[str]:
    required = set(schema.get("required", []))
    rows = ["| field | type | default | what |", "| --- | --- | --- | --- |"]
    for name, prop in schema.get("properties", {}).items():
        default = "required" if name in required else (
            f"`{json.dumps(prop['default'])}`" if "default" in prop else "")
        what = prop.get("description", "")
        rows.append(f"| `{name}` | {cell(type_text(prop))} | {cell(default)} | {cell(what)} |")
    return rows


def body_ref(content: dict[str, Any] | None) -> str | None:
    schema = (content or {}).get("application/json", {}).get("schema", {})
    return type_text(schema) if schema else None


def openapi_markdown(schema: dict[str, Any]) -> str:
    out: list[str] = ["## Routes"]
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            out += ["", f"### `{method.upper()} {path}`", "", f"**{op.get('summary', '')}.** "
                    + (op.get("description") or "").replace("\n", " ")]
            request = body_ref(op.get("requestBody", {}).get("content"))
            if request:
                out += ["", f"Request body: {request}."]
            answers = []
            for status, response in op.get("responses", {}).items():
                body = body_ref(response.get("content"))
                answers.append(f"| {status} | {cell(response.get('description', ''))} | {body or ''} |")
            out += ["", "| status | when | body |", "| --- | --- | --- |", *answers]
    out += ["", "## Schemas"]
    for name, component in schema["components"]["schemas"].items():
        out += ["", f"### {name}", ""]
        if component.get("description"):
            out += [component["description"].replace("\n", " "), ""]
        out += fields_table(component)
        for example in component.get("examples", [])[:1]:
            out += ["", "Example:", "", "```json", json.dumps(example, indent=2), "```"]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------- hooks
def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, OPENAPI_FILE, content=json.dumps(openapi_schema(), indent=2)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    generated = {"configuration.md": (SETTINGS_MARKER, settings_markdown),
                 "api-reference.md": (OPENAPI_MARKER, lambda: openapi_markdown(openapi_schema()))}
    if page.file.src_uri not in generated:
        return markdown
    marker, make = generated[page.file.src_uri]
    if marker not in markdown:
        raise PluginError(f"{page.file.src_uri} lost its marker {marker}: nothing to generate into")
    return markdown.replace(marker, make())
