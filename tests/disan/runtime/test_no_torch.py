"""The service must run without torch: import it and serve the tiny bundle with torch blocked."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

BLOCK_TORCH = """
import sys
sys.modules["torch"] = None  # `import torch` now raises ImportError, like an env without it
"""


def run_python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + textwrap.dedent(code), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def test_import_service_without_torch():
    proc = run_python("""
        import service, service.main, service.cli, service.inference.engine, service.backend.batcher
        import disan.runtime.runtime
        loaded = sorted(m for m, mod in sys.modules.items() if mod is not None and m.split(".")[0] == "torch")
        assert not loaded, loaded
        print("ok")
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_blocking_really_blocks_torch():
    """Guard against a vacuous test: with the block in place, importing torch must fail."""
    proc = run_python("import torch")
    assert proc.returncode != 0 and "import of torch halted" in proc.stderr


def test_serve_tiny_bundle_without_torch(tiny_bundle):
    proc = run_python("""
        import time
        from fastapi.testclient import TestClient
        from service.main import create_app
        from service.settings import Settings
        with TestClient(create_app(Settings(bundle=sys.argv[1]))) as c:
            deadline = time.monotonic() + 60
            while c.get("/ready").status_code != 200:
                assert time.monotonic() < deadline, c.get("/ready").json()
                time.sleep(0.05)
            r = c.post("/embed", json={"texts": ["a man is playing"]})
            assert r.status_code == 200, r.text
            assert c.post("/nli", json={"pairs": [{"premise": "a", "hypothesis": "b"}]}).status_code == 200
        assert "torch" not in {m.split(".")[0] for m, mod in sys.modules.items() if mod is not None}
        print("served")
    """, str(tiny_bundle))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("served")


def test_disan_serve_without_bundle_names_the_export_command(tmp_path):
    proc = run_python("""
        from disan.cli import main
        raise SystemExit(main(["serve", "--bundle", sys.argv[1]]))
    """, str(tmp_path / "missing"))
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "disan export --nli CKPT --sentiment CKPT --out models/default" in lines[0]
