"""Bundle weights: every large tensor stored once, word-vector tables in fp16 checked as shipped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from disan.bundle.manifest import load_manifest, variant_files

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from conftest import bundle_graph_files, ort_session, padded_ids  # noqa: E402

from model_export.export import ExportConfig, build_bundle  # noqa: E402
from model_export.verify import verify_bundle  # noqa: E402

torch.set_num_threads(1)


def test_weights_stored_once(tiny_bundle, tiny_models):
    """Size accounting: every large tensor lives in weights.data once, whatever the number of
    graphs, sets and variants reading it; graph files hold no large weights of their own."""
    from model_export.graphs.weights import EXTERNAL_MIN_BYTES

    m = load_manifest(tiny_bundle)
    data = (tiny_bundle / "weights.data").read_bytes()
    for model in tiny_models:  # each encoder's embedding table: once, shared by cpu, gpu, explain, fp16
        table = model.encoder.embed.weight.detach().numpy().tobytes()
        assert data.count(table) == 1
    seen: dict[tuple, int] = {}
    for file in bundle_graph_files(m):
        graph = onnx.load(str(tiny_bundle / file), load_external_data=False).graph
        for init in graph.initializer:
            if init.data_location == onnx.TensorProto.EXTERNAL:
                info = {e.key: e.value for e in init.external_data}
                assert info["location"] == "weights.data"
                seen.setdefault((info["offset"], info["length"]), 0)
            else:  # kept inline: small constants only
                assert len(init.raw_data) < EXTERNAL_MIN_BYTES, (file, init.name)
    assert len(seen) == m["weights"]["tensors"]  # every stored tensor is read by some graph
    assert m["weights"]["bytes"] == len(data)
    assert m["sizes"]["total_bytes"] == sum(p.stat().st_size for p in tiny_bundle.iterdir()
                                            if p.name != "manifest.json")
    # the fp16 graphs read the fp32 tensors and cast them: no second copy in half precision
    fp16 = onnx.load(str(tiny_bundle / variant_files(m, "gpu", "fp16")["nli_head"]), load_external_data=False)
    big_halves = [i for i in fp16.graph.initializer if i.data_type == onnx.TensorProto.FLOAT16
                  and i.data_location != onnx.TensorProto.EXTERNAL and len(i.raw_data) >= EXTERNAL_MIN_BYTES]
    assert not big_halves and any(n.op_type == "Cast" for n in fp16.graph.node)


@pytest.fixture(scope="module")
def half_bundle(tiny_checkpoints, tmp_path_factory) -> Path:
    """The tiny bundle exported with --embedding-storage fp16."""
    out = tmp_path_factory.mktemp("half") / "bundle"
    build_bundle(ExportConfig(tiny_checkpoints.nli, tiny_checkpoints.sentiment, out, fp16=True, int8=True,
                              embedding_storage="fp16"), log=lambda *_: None)
    return out


def test_fp16_embedding_storage_halves_the_tables(half_bundle, tiny_bundle, tiny_models):
    """The word-vector tables are stored once, in fp16: weights.data shrinks by half their fp32
    bytes, and no graph holds an fp32 copy."""
    m = load_manifest(half_bundle)
    assert m["weights"]["embedding_storage"] == "fp16" and m["verification"]["passed"]
    data = (half_bundle / "weights.data").read_bytes()
    saved = 0
    for model in tiny_models:
        table = model.encoder.embed.weight.detach()
        assert data.count(table.half().numpy().tobytes()) == 1
        assert data.count(table.numpy().tobytes()) == 0
        saved += table.numpy().nbytes // 2
    shrink = (tiny_bundle / "weights.data").stat().st_size - len(data)
    assert abs(shrink - saved) <= 2 * 4096, (shrink, saved)  # page alignment of the offsets
    for file in bundle_graph_files(m):
        graph = onnx.load(str(half_bundle / file), load_external_data=False).graph
        tables = [i for i in graph.initializer if i.name.endswith("encoder.embed.weight")]
        assert not tables, (file, [i.name for i in tables])


def test_fp16_embedding_storage_checked_as_shipped(half_bundle, tiny_checkpoints, tiny_models):
    """The graphs compute the checkpoints' models with the tables rounded to fp16: ORT equals that
    model (and not the unrounded one, which verify must round too), and the bundle's weights
    rebuild it exactly."""
    from model_export.graphs.storage import round_tables
    from model_export.references import bundle_models

    m = load_manifest(half_bundle)
    rounded = []
    for model in tiny_models:
        twin = type(model)(model.cfg)
        twin.load_state_dict(model.state_dict())
        round_tables([twin.eval()], "fp16")
        rounded.append(twin)
    rebuilt = [bundle_models(half_bundle, m)[task] for task in ("nli", "sentiment")]
    for got, want in zip(rebuilt, rounded, strict=True):
        assert torch.equal(got.encoder.embed.weight, want.encoder.embed.weight)
    ids, mask = padded_ids(np.random.default_rng(0), tiny_models[1].cfg.vocab_size, 4, 9)
    with torch.no_grad():
        want = torch.softmax(rounded[1](torch.from_numpy(ids), torch.from_numpy(mask)), -1).numpy()
        raw = torch.softmax(tiny_models[1](torch.from_numpy(ids), torch.from_numpy(mask)), -1).numpy()
    for set_name in ("cpu", "gpu"):
        got = ort_session(half_bundle / variant_files(m, set_name, "fp32")["sentiment"]).run(
            None, {"ids": ids, "mask": mask})[0]
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
        assert np.abs(got - raw).max() > 1e-6  # the rounding is visible: the check above can fail
    result = verify_bundle(half_bundle, checkpoints=tiny_checkpoints.nli.parent, dev_limit=50)
    assert result["passed"] and result["mode"] == "parity_vs_checkpoints", result
    assert verify_bundle(half_bundle, dev_limit=50)["passed"]


def test_fp16_embedding_storage_refuses_out_of_range_tables(tiny_models):
    from model_export.graphs.storage import round_tables

    model = type(tiny_models[0])(tiny_models[0].cfg)
    with torch.no_grad():
        model.encoder.embed.weight[3, 0] = 1e6
    with pytest.raises(ValueError, match="fp16's range"):
        round_tables([model], "fp16")


@pytest.fixture(scope="module")
def half_matrix_bundle(tiny_checkpoints, tmp_path_factory) -> Path:
    """The tiny bundle exported with --matrix-storage fp16 (the tables stay fp32)."""
    out = tmp_path_factory.mktemp("half-matrices") / "bundle"
    build_bundle(ExportConfig(tiny_checkpoints.nli, tiny_checkpoints.sentiment, out, fp16=True,
                              matrix_storage="fp16"), log=lambda *_: None)
    return out


def _rounded_matrices(model):
    from model_export.graphs.storage import round_matrices

    twin = type(model)(model.cfg)
    twin.load_state_dict(model.state_dict())
    round_matrices(twin.eval(), "fp16")
    return twin


def test_fp16_matrix_storage_halves_the_other_parameters(half_matrix_bundle, tiny_bundle, tiny_models):
    """Every stored parameter but the tables is stored once, in fp16: weights.data shrinks by half
    of their fp32 bytes, the tables keep theirs, and no graph names an fp32 copy."""
    from model_export.graphs.storage import HALF_STORED
    from model_export.graphs.weights import EXTERNAL_MIN_BYTES

    m = load_manifest(half_matrix_bundle)
    assert m["weights"]["matrix_storage"] == {"nli": "fp16", "sentiment": "fp16"}
    assert m["verification"]["passed"] and "matrix_storage" not in load_manifest(tiny_bundle)["weights"]
    data = (half_matrix_bundle / "weights.data").read_bytes()
    halves = 0
    for model in tiny_models:
        table = model.encoder.embed.weight.detach()
        assert data.count(table.numpy().tobytes()) == 1  # the table's own storage: fp32 here
        for name, value in _rounded_matrices(model).state_dict().items():
            if name != "encoder.embed.weight" and value.is_floating_point() and value.numel() * 4 >= 2048:
                assert data.count(value.half().numpy().tobytes()) >= 1, name
                halves += value.numel() * 2
    shrink = (tiny_bundle / "weights.data").stat().st_size - len(data)
    assert shrink >= 0.9 * halves, (shrink, halves)
    for file in bundle_graph_files(m):
        graph = onnx.load(str(half_matrix_bundle / file), load_external_data=False).graph
        fp32 = [i.name for i in graph.initializer if i.data_type == onnx.TensorProto.FLOAT and "/" in i.name
                and not i.name.endswith("encoder.embed.weight") and len(i.raw_data) >= EXTERNAL_MIN_BYTES
                or i.data_location == onnx.TensorProto.EXTERNAL and i.data_type == onnx.TensorProto.FLOAT
                and not i.name.endswith(("embed.weight", "/scale"))]
        assert not fp32, (file, fp32)
        assert any(i.name.endswith(HALF_STORED) for i in graph.initializer), file


def test_fp16_matrix_storage_checked_as_shipped(half_matrix_bundle, tiny_checkpoints, tiny_models):
    """The graphs compute the models with every other parameter rounded to fp16: ORT equals that
    model and not the unrounded one, the bundle's weights rebuild it exactly, and `disan verify`
    rounds the checkpoints as the export did (from the manifest) before comparing."""
    from model_export.references import bundle_models

    m = load_manifest(half_matrix_bundle)
    rounded = [_rounded_matrices(model) for model in tiny_models]
    rebuilt = [bundle_models(half_matrix_bundle, m)[task] for task in ("nli", "sentiment")]
    for got, want in zip(rebuilt, rounded, strict=True):
        for name, value in want.state_dict().items():
            if value.is_floating_point():
                assert torch.equal(got.state_dict()[name], value), name
    ids, mask = padded_ids(np.random.default_rng(1), tiny_models[1].cfg.vocab_size, 4, 9)
    with torch.no_grad():
        want = torch.softmax(rounded[1](torch.from_numpy(ids), torch.from_numpy(mask)), -1).numpy()
        raw = torch.softmax(tiny_models[1](torch.from_numpy(ids), torch.from_numpy(mask)), -1).numpy()
    for set_name, variant in (("cpu", "fp32"), ("gpu", "fp32"), ("gpu", "fp16")):
        got = ort_session(half_matrix_bundle / variant_files(m, set_name, variant)["sentiment"]).run(
            None, {"ids": ids, "mask": mask})[0]
        if variant == "fp32":
            np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
            assert np.abs(got - raw).max() > 1e-6  # the rounding is visible: the check above can fail
        else:
            np.testing.assert_allclose(got, want, atol=2e-2, rtol=0)
    result = verify_bundle(half_matrix_bundle, checkpoints=tiny_checkpoints.nli.parent, dev_limit=50)
    assert result["passed"] and result["mode"] == "parity_vs_checkpoints", result
    assert verify_bundle(half_matrix_bundle, dev_limit=50)["passed"]


def test_matrix_storage_refuses_unknown_storage(tiny_checkpoints, tmp_path):
    with pytest.raises(ValueError, match="--matrix-storage 'int8'"):
        build_bundle(ExportConfig(tiny_checkpoints.nli, tiny_checkpoints.sentiment, tmp_path / "b",
                                  matrix_storage="int8"), log=lambda *_: None)
