"""onnxruntime sessions for checking bundles: CPU, single-threaded, inputs in contract order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from disan.bundle.manifest import GRAPHS, TOKEN_AXES


def session(path: Path):
    """A CPU onnxruntime session (verification is always done on CPU, single-threaded)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def run_graph(sess, graph: str, *arrays: np.ndarray) -> list[np.ndarray]:
    """Run a graph session with inputs in contract order."""
    return sess.run(None, dict(zip(GRAPHS[graph].inputs, arrays, strict=True)))


def trim(output: str, arr: np.ndarray, n: int) -> np.ndarray:
    """One row's output cut to its own `n` tokens on its token axes (TOKEN_AXES)."""
    axes = TOKEN_AXES.get(output, 0)
    return arr[tuple(slice(0, n) for _ in range(axes))] if axes else arr
