"""research's tests use the product's fixtures and helpers (tests/conftest.py), loaded here under
another module name, so `from conftest import ...` in these tests finds the same names."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PRODUCT = Path(__file__).resolve().parents[2] / "tests" / "conftest.py"
_spec = importlib.util.spec_from_file_location("product_conftest", _PRODUCT)
_module = importlib.util.module_from_spec(_spec)
sys.modules["product_conftest"] = _module
_spec.loader.exec_module(_module)

from product_conftest import *  # noqa: E402, F403  (fixtures and helpers, as tests/ sees them)
