"""Batching limits follow the provider that really loaded; explicit settings always win."""

from __future__ import annotations

import pytest

from disan.runtime.ort_session import CPU, CUDA
from service.common.batching_defaults import PROVIDER_DEFAULTS, resolve_batching


def test_cpu_gets_the_cpu_defaults():
    b = resolve_batching(0, 0, CPU)
    assert (b.max_batch_size, b.max_batch_cells) == (64, 4096)
    assert b.source["max_batch_size"] == b.source["max_batch_cells"] == "auto: CPU default"


def test_cuda_gets_the_cuda_defaults():
    b = resolve_batching(0, 0, CUDA)
    assert (b.max_batch_size, b.max_batch_cells) == (1024, 1 << 18)  # bench/gpu.json: sweep + long texts
    assert b.source["max_batch_cells"] == "auto: CUDA default"
    assert b.source["batch_concurrency"].startswith("auto")


@pytest.mark.parametrize("provider", [CPU, CUDA, "TensorrtExecutionProvider"])
def test_explicit_settings_win_on_every_provider(provider):
    b = resolve_batching(8, 5000, provider, batch_concurrency=3)
    assert (b.max_batch_size, b.max_batch_cells) == (8, 5000)
    assert set(b.source.values()) == {"set explicitly"}
    # one knob explicit, the other auto
    half = resolve_batching(0, 5000, provider)
    assert half.max_batch_cells == 5000 and half.source["max_batch_size"].startswith("auto")


def test_unknown_provider_falls_back_to_cpu_values_and_says_so():
    b = resolve_batching(0, 0, "ROCMExecutionProvider")
    assert (b.max_batch_size, b.max_batch_cells) == (64, 4096)
    assert "no values for ROCMExecutionProvider" in b.source["max_batch_size"]


def test_cuda_calls_are_bigger_than_cpu_calls():
    # The point of following the provider: a GPU needs large calls, a CPU small ones.
    cpu, cuda = PROVIDER_DEFAULTS[CPU], PROVIDER_DEFAULTS[CUDA]
    assert cuda.max_batch_size > cpu.max_batch_size and cuda.max_batch_cells > cpu.max_batch_cells


# ---- through the engine and /info, with the live provider monkeypatched ----
def _info(bundle, monkeypatch, provider: str | None, **settings) -> tuple[dict, object]:
    from fastapi.testclient import TestClient
    from support_serving import wait_ready  # the test client helpers need the service extra

    from disan.runtime.runtime import Runtime
    from service.main import create_app
    from service.settings import Settings

    if provider is not None:  # what the sessions would report on a GPU host
        monkeypatch.setattr(Runtime, "provider", property(lambda self: provider))
    with TestClient(create_app(Settings(bundle=bundle, **settings))) as client:
        wait_ready(client.get)
        info = client.get("/info").json()
        encoder = client.app.state.engine.batchers["encoder"]
        assert client.post("/embed", json={"texts": ["a man is playing"]}).status_code == 200
        return info, (encoder.max_batch_size, encoder.max_batch_cells)


@pytest.mark.parametrize(("provider", "expected", "why"), [
    (None, (64, 4096), "auto: CPU default"),  # the real provider of this CPU machine
    (CUDA, (1024, 1 << 18), "auto: CUDA default"),
])
def test_engine_uses_and_info_reports_the_provider_defaults(tiny_bundle, monkeypatch, provider, expected,
                                                            why):
    info, used = _info(tiny_bundle, monkeypatch, provider)
    assert used == expected
    batching = info["batching"]
    assert (batching["max_batch_size"], batching["max_batch_cells"]) == expected
    assert batching["source"]["max_batch_size"] == batching["source"]["max_batch_cells"] == why


def test_engine_keeps_explicit_settings_on_cuda(tiny_bundle, monkeypatch):
    info, used = _info(tiny_bundle, monkeypatch, CUDA, max_batch_size=32, max_batch_cells=8192)
    assert used == (32, 8192)
    assert info["batching"]["source"]["max_batch_cells"] == "set explicitly"
