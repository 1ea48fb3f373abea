"""disan.runtime.ort_session: how many onnxruntime calls run at once with how many threads, CUDA preload."""

from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime")

from disan.runtime import ort_session  # noqa: E402
from disan.runtime.ort_session import RuntimeOptions  # noqa: E402


def test_call_layout_auto_and_explicit(monkeypatch):
    """batch_concurrency=0: one single-threaded call per core of this worker on CPU, one call on
    CUDA; explicit values are kept."""
    monkeypatch.setattr(ort_session, "cpu_cores", lambda: 8)
    cpu, cuda = [ort_session.CPU], [ort_session.CUDA, ort_session.CPU]
    auto = RuntimeOptions(batch_concurrency=0)
    assert ort_session.call_layout(auto, cpu) == (8, 1)
    assert ort_session.call_layout(RuntimeOptions(batch_concurrency=0, workers=2), cpu) == (4, 1)
    assert ort_session.call_layout(RuntimeOptions(batch_concurrency=0, intra_op_threads=2), cpu) == (4, 2)
    assert ort_session.call_layout(RuntimeOptions(batch_concurrency=0, workers=16), cpu) == (1, 1)
    assert ort_session.call_layout(auto, cuda) == (1, 0)
    assert ort_session.call_layout(RuntimeOptions(batch_concurrency=3), cpu) == (3, 0)
    assert ort_session.call_layout(RuntimeOptions(batch_concurrency=1, intra_op_threads=2), cpu) == (1, 2)


def test_preload_cuda_is_guarded(monkeypatch):
    """preload_dlls only where onnxruntime has it (onnxruntime-gpu >= 1.21), once per process."""
    calls: list[int] = []
    monkeypatch.setattr(ort_session, "_preloaded", False)
    monkeypatch.setattr(ort_session.ort, "preload_dlls", lambda: calls.append(1), raising=False)
    ort_session.preload_cuda()
    ort_session.preload_cuda()
    assert calls == [1]
    monkeypatch.setattr(ort_session, "_preloaded", False)
    monkeypatch.delattr(ort_session.ort, "preload_dlls")
    ort_session.preload_cuda()  # an onnxruntime without it: nothing to do, no error
