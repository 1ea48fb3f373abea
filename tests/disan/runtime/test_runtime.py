"""disan.runtime.runtime: options independent of the service's settings, graph-set choice, the
offline loader."""

from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime")

from disan.runtime import (
    ort_session,  # noqa: E402
    runtime,  # noqa: E402
)
from disan.runtime.runtime import RuntimeOptions, load_offline  # noqa: E402


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


# ---- graph sets: which set and variant load, by provider and by option ----

def fake_cuda(monkeypatch, loads: bool) -> list[str]:
    """Pretend this onnxruntime has CUDA, whose sessions do (or do not) really come up on it.
    Returns the list preload_cuda calls are recorded in."""
    calls: list[str] = []
    monkeypatch.setattr(ort_session.ort, "get_available_providers", lambda: [runtime.CUDA, runtime.CPU])
    monkeypatch.setattr(runtime, "cuda_active", lambda session: loads)
    monkeypatch.setattr(runtime, "preload_cuda", lambda: calls.append("preload"))
    return calls


def loaded_files(rt) -> dict[str, str]:
    return {name: g.file for name, g in rt.graphs.items()}


def test_cpu_provider_loads_the_cpu_set(tiny_bundle):
    from disan.bundle.manifest import variant_files

    rt = load_offline(tiny_bundle)
    assert (rt.graph_set, rt.variant) == ("cpu", "fp32")
    assert loaded_files(rt) == variant_files(rt.manifest, "cpu", "fp32")
    assert rt.graphs["encoder"].file.endswith(".chunked.onnx")
    assert rt.has_explain and rt.has_embed_explain


@pytest.mark.filterwarnings("ignore::UserWarning")  # ORT: "CUDAExecutionProvider not available"
def test_cuda_that_loads_picks_the_gpu_set_in_fp16(monkeypatch, tiny_bundle):
    from disan.bundle.manifest import variant_files

    calls = fake_cuda(monkeypatch, loads=True)
    rt = runtime.Runtime(tiny_bundle, RuntimeOptions())
    assert (rt.graph_set, rt.variant) == ("gpu", "fp16")
    assert loaded_files(rt) == variant_files(rt.manifest, "gpu", "fp16")
    assert calls == ["preload"]  # CUDA/cuDNN from their wheels, before the first CUDA session
    assert rt.batch_concurrency == 1  # the CUDA call layout
    # --variant overrides the set's default; a variant the set lacks comes from the other set
    rt = runtime.Runtime(tiny_bundle, RuntimeOptions(variant="fp32"))
    assert (rt.graph_set, rt.variant) == ("gpu", "fp32") and "chunked" not in rt.graphs["encoder"].file
    rt = runtime.Runtime(tiny_bundle, RuntimeOptions(variant="int8"))
    assert (rt.graph_set, rt.variant) == ("cpu", "int8")
    rt = runtime.Runtime(tiny_bundle, RuntimeOptions(graph_set="cpu"))
    assert (rt.graph_set, rt.variant) == ("cpu", "fp32")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_cuda_that_does_not_load_falls_back_to_the_cpu_set(monkeypatch, tiny_bundle, caplog):
    fake_cuda(monkeypatch, loads=False)
    rt = runtime.Runtime(tiny_bundle, RuntimeOptions())
    assert (rt.graph_set, rt.variant) == ("cpu", "fp32")
    assert "CUDA was requested but unavailable" in caplog.text
    assert rt.provider == runtime.CPU


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_providers_cuda_fails_loudly(monkeypatch, tiny_bundle):
    """providers=cuda never serves on a silent CPU fallback."""
    from disan.bundle.manifest import BundleError

    with pytest.raises(BundleError, match="no CUDAExecutionProvider"):
        runtime.Runtime(tiny_bundle, RuntimeOptions(providers="cuda"))  # this CPU-only onnxruntime
    fake_cuda(monkeypatch, loads=False)
    with pytest.raises(BundleError, match="providers=cuda but the session runs on CPUExecutionProvider"):
        runtime.Runtime(tiny_bundle, RuntimeOptions(providers="cuda"))


def test_variant_overrides_on_cpu(tiny_bundle):
    from disan.bundle.manifest import BundleError

    rt = runtime.Runtime(tiny_bundle, RuntimeOptions(providers="cpu", variant="fp16"))
    assert (rt.graph_set, rt.variant) == ("gpu", "fp16")  # fp16 graphs run on CPU too (slowly)
    rt = runtime.Runtime(tiny_bundle, RuntimeOptions(providers="cpu", graph_set="gpu"))
    assert (rt.graph_set, rt.variant) == ("gpu", "fp16")
    with pytest.raises(BundleError, match="no int8 graphs"):
        runtime.Runtime(tiny_bundle, RuntimeOptions(providers="cpu", graph_set="gpu", variant="int8"))


def test_nli_runs_as_encoder_then_head(tiny_bundle):
    """The one NLI path (disan.runtime.encoder.nli_steps) on id rows: the NLI route's encoder on
    each side, then the head."""
    import numpy as np

    from disan.runtime.tasks import nli_steps, run_steps
    from disan.text.prepare import PreparedText

    rt = load_offline(tiny_bundle)
    pairs = [([5, 6, 7], [8, 9]), ([10], [11, 12, 13, 14])]
    sides = [[PreparedText([], ids, [ids], length=len(ids)) for ids in side]
             for side in zip(*pairs, strict=True)]
    run = {"nli": lambda rows: rt.encode_with(rt.graph_for("nli"), rows), "nli_head": rt.nli_head}
    results = run_steps(nli_steps(*sides, rt.labels["nli"]), lambda route, payloads: run[route](payloads))
    probs = np.asarray([[r["scores"][k] for k in rt.labels["nli"]] for r in results])
    u, v = rt.embed([p for p, _ in pairs]), rt.embed([h for _, h in pairs])
    np.testing.assert_allclose(probs, np.stack(rt.nli_head(list(zip(u, v, strict=True)))), atol=1e-6)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    rows = rt.nli_head([(np.stack([u[0], u[1]]), np.stack([v[0], v[1]])), (u[1], v[1])])
    assert rows[0].shape == (2, 3) and rows[1].shape == (3,)
    np.testing.assert_allclose(rows[0], probs, atol=1e-6)


@pytest.mark.parametrize("field,value", [("providers", "tpu"), ("variant", "int4"), ("graph_set", "npu"),
                                         ("graph_optimization_level", "max"), ("intra_op_threads", -1),
                                         ("batch_concurrency", -2), ("workers", 0), ("max_tokens", 0)])
def test_options_outside_their_type_are_refused(field, value):
    """`disan.Encoder(bundle, providers="tpu")` ran on the CPU as if "auto" had been asked, and a
    negative thread count reached onnxruntime: the options now refuse what their type does not
    allow, naming the field (the service's settings refused these already)."""
    with pytest.raises(ValueError, match=rf"^{field}="):
        RuntimeOptions(**{field: value})


def test_the_variant_choices_are_the_bundle_variants_and_auto():
    """`Variant` spells the manifest's VARIANTS a second time (a Literal cannot be built from a
    tuple for type checkers); this keeps the two lists from drifting apart."""
    from typing import get_args

    from disan.bundle.manifest import VARIANTS

    assert get_args(ort_session.Variant) == ("auto", *VARIANTS)
