"""research's tests use the product's fixtures and helpers (tests/conftest.py), loaded here under
another module name, so `from conftest import ...` in these tests finds the same names; and the
device-lease scripts' fixtures, shared by the lease tests."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

_PRODUCT = Path(__file__).resolve().parents[2] / "tests" / "conftest.py"
sys.path.insert(0, str(_PRODUCT.parent))  # and its helper modules (support_serving, support_files)
_spec = importlib.util.spec_from_file_location("product_conftest", _PRODUCT)
_module = importlib.util.module_from_spec(_spec)
sys.modules["product_conftest"] = _module
_spec.loader.exec_module(_module)

from product_conftest import *  # noqa: E402, F403  (fixtures and helpers, as tests/ sees them)

# the device-lease scripts (research/gpu-lease, bench/gpu_device.sh), in the order the tests index them
REPO = Path(__file__).resolve().parents[2]
LEASE_SCRIPTS = [REPO / "research" / "gpu-lease" / name
                 for name in ("pack.sh", "device.sh", "pack-sentiment.sh", "pack-student.sh", "kit-lib.sh")]
LEASE_SCRIPTS.append(REPO / "bench" / "gpu_device.sh")


@pytest.fixture
def bash() -> str:
    path = shutil.which("bash")
    if path is None:
        pytest.skip("no bash")
    return path


def stub_machine(tmp_path: Path, python3: str) -> tuple[Path, Path, dict[str, str]]:
    """A device machine for device.sh's steps: `python3` replaced by a shell stand-in, an empty kit
    folder and $OUT; returns them with the environment the script runs in."""
    stub = tmp_path / "bin" / "python3"
    stub.parent.mkdir()
    stub.write_text(python3)
    stub.chmod(0o755)
    kit, out = tmp_path / "kit", tmp_path / "out"
    kit.mkdir()
    out.mkdir()
    env = {"PATH": f"{stub.parent}:/usr/bin:/bin", "KIT": str(kit), "OUT": str(out), "DEVICE": "cpu"}
    return kit, out, env

