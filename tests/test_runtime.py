"""disan.runtime: call layout, options independent of the service's settings, the offline loader."""

from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime")

from disan import runtime  # noqa: E402
from disan.runtime import RuntimeOptions, load_offline  # noqa: E402


def test_call_layout_auto_and_explicit(monkeypatch):
    """batch_concurrency=0: one single-threaded call per core of this worker on CPU, one call on
    CUDA; explicit values are kept."""
    monkeypatch.setattr(runtime, "cpu_cores", lambda: 8)
    cpu, cuda = [runtime.CPU], [runtime.CUDA, runtime.CPU]
    auto = RuntimeOptions(batch_concurrency=0)
    assert runtime.call_layout(auto, cpu) == (8, 1)
    assert runtime.call_layout(RuntimeOptions(batch_concurrency=0, workers=2), cpu) == (4, 1)
    assert runtime.call_layout(RuntimeOptions(batch_concurrency=0, intra_op_threads=2), cpu) == (4, 2)
    assert runtime.call_layout(RuntimeOptions(batch_concurrency=0, workers=16), cpu) == (1, 1)
    assert runtime.call_layout(auto, cuda) == (1, 0)
    assert runtime.call_layout(RuntimeOptions(batch_concurrency=3), cpu) == (3, 0)
    assert runtime.call_layout(RuntimeOptions(batch_concurrency=1, intra_op_threads=2), cpu) == (1, 2)


def test_offline_runtime_ignores_service_environment(monkeypatch, tiny_bundle):
    """`disan eval` once built the service's Settings, so DISAN_MAX_TOKENS=5 cut every input."""
    monkeypatch.setenv("DISAN_MAX_TOKENS", "5")
    monkeypatch.setenv("DISAN_VARIANT", "int8")
    rt = load_offline(tiny_bundle)
    assert rt.max_tokens == 128  # the bundle's max_len
    assert all(g.session.get_providers() == ["CPUExecutionProvider"] for g in rt.graphs.values())
    assert len(rt.text_ids("a " * 300)) == 128


def test_service_settings_map_onto_runtime_options(monkeypatch):
    from service.settings import Settings

    monkeypatch.setenv("DISAN_MAX_TOKENS", "5")
    opts = Settings(variant="int8", batch_concurrency=2).runtime_options()
    assert (opts.max_tokens, opts.variant, opts.batch_concurrency) == (5, "int8", 2)
