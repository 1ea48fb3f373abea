"""The device-machine scripts parse (they only run on a lent GPU, or in a dry run by hand)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = [ROOT / "deploy" / "gpu-lease" / "pack.sh", ROOT / "deploy" / "gpu-lease" / "device.sh",
           ROOT / "bench" / "gpu_device.sh"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses(script: Path) -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    out = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr


def test_device_script_refuses_an_unknown_step(tmp_path: Path) -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    out = subprocess.run([bash, str(SCRIPTS[1]), "nonsense"], capture_output=True, text=True,
                         cwd=tmp_path, check=False)
    assert out.returncode == 2 and "unknown step nonsense" in out.stdout
