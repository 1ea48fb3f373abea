"""Pages the service serves itself: /docs and /redoc from local assets (no CDN, so they work on an
air-gapped host) and the playground at /ui, also from a non-editable install."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.main import create_app
from service.settings import Settings

REPO = Path(__file__).resolve().parents[3]
WEB_FILES = ["index.html", "app.js", "style.css"]


@pytest.fixture(scope="module")
def client():
    # No `with`: the lifespan (model loading) never runs; the pages do not need the model.
    return TestClient(create_app(Settings(bundle=REPO / "no-bundle-needed")))


def references(html: str) -> list[str]:
    """Every src/href of a page, plus any absolute URL anywhere in it."""
    return re.findall(r'(?:src|href)="([^"]*)"', html) + re.findall(r"\b(?:https?:)?//[\w.-]+\.\w+", html)


@pytest.mark.parametrize(("page", "assets"), [
    ("/docs", {"/docs-assets/swagger-ui-bundle.js", "/docs-assets/swagger-ui.css",
               "/docs-assets/favicon.png"}),
    ("/redoc", {"/docs-assets/redoc.standalone.js", "/docs-assets/favicon.png"}),
])
def test_docs_reference_only_local_assets_that_are_served(client, page, assets):
    r = client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    refs = references(r.text)
    assert set(refs) == assets, refs  # nothing from a CDN, no Google Fonts
    for url in refs:
        asset = client.get(url)
        assert asset.status_code == 200 and len(asset.content) > 1000, url
    assert "SwaggerUIBundle" in client.get("/docs-assets/swagger-ui-bundle.js").text
    assert '"validatorUrl": null' in client.get("/docs").text  # no call to swagger.io's validator
    assert client.get("/openapi.json").status_code == 200


def test_docs_routes_stay_out_of_the_api_schema(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert not {"/docs", "/redoc", "/docs/oauth2-redirect"} & set(paths)
    assert set(paths["/"]) == {"post"}  # text-embeddings-inference's POST /; GET / (the playground) stays out


def test_playground_is_served_and_self_contained(client):
    home = client.get("/", follow_redirects=False)
    assert home.status_code in (302, 307) and home.headers["location"] == "ui/"
    page = client.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert set(references(page.text)) == {"style.css", "app.js", "../docs", "../redoc", "../info"}
    for name in WEB_FILES[1:]:
        r = client.get(f"/ui/{name}")
        assert r.status_code == 200 and r.text, name
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", r.text), name  # only the SVG namespace


def test_web_files_ship_in_a_non_editable_install(tmp_path):
    """`pip install .` (a wheel) must carry service/http/web, and the installed app must serve it."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for package in ("disan", "model_export", "service"):
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            str(src), "-w", str(tmp_path / "wheel")],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"service/http/web/{name}" for name in WEB_FILES} <= set(names)
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)  # what pip install puts in site-packages
    code = textwrap.dedent("""
        import sys
        from fastapi.testclient import TestClient
        import service
        from service.main import create_app
        from service.settings import Settings
        assert service.__file__.startswith(sys.argv[1]), service.__file__
        client = TestClient(create_app(Settings(bundle="nowhere")))
        for path in ("/ui/", "/ui/app.js", "/ui/style.css", "/docs", "/docs-assets/swagger-ui-bundle.js"):
            assert client.get(path).status_code == 200, path
        print("served")
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(target)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and proc.stdout.strip() == "served", proc.stderr[-2000:]
