"""`python -m model_export.dimensions --span --keep-axes`: axes that span the encoder's vectors
serve every size short of the whole (past the axes, the same vector with zeros after it), and
the sizes served before stay the same vectors."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from conftest import WORDS, make_tiny_checkpoint  # noqa: E402
from support_serving import wait_ready  # noqa: E402

from disan import Encoder  # noqa: E402
from disan.bundle.dimensions import PROJECTION_FILE, load_projection  # noqa: E402
from disan.bundle.manifest import load_manifest  # noqa: E402
from disan.text.tokenizer import Vocab  # noqa: E402
from model_export.bundle_diff import compare  # noqa: E402
from model_export.dimensions import main  # noqa: E402
from model_export.export import ExportConfig, build_bundle  # noqa: E402

# a distilled encoder's head maps DiSAN's 2 * d_h (16) sentence vector and a bias to 24
# components: its vectors span at most 17 directions of 24
PROJ_DIM, SPAN_AT_MOST = 24, 17
TEXTS = ["a man is playing guitar", "the movie was great !", "dogs run in the park",
         "the woman is not reading a book at the table in the rain"]


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def fit(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("texts") / "fit.txt"
    path.write_text("\n".join(" ".join(rng.choice(WORDS, size=int(rng.integers(3, 12)))) for _ in range(300)))
    return path


@pytest.fixture(scope="module")
def eight(tmp_path_factory, tiny_checkpoints, fit):
    """An embed bundle (24-d vectors) serving any size up to 8 through 8 principal axes."""
    root = tmp_path_factory.mktemp("span")
    student = make_tiny_checkpoint(root / "student.pt", "encoder", Vocab(WORDS), [], seed=5,
                                   proj_dim=PROJ_DIM, embed_dim=12)
    out = root / "bundle"
    build_bundle(ExportConfig(tiny_checkpoints.nli, tiny_checkpoints.sentiment, out, embed=student,
                              name="tiny-distilled"), log=lambda *_: None)
    assert main([str(out), "--texts", str(fit), "--sizes", "8"]) == 0
    return out


@pytest.fixture(scope="module")
def spanning(eight, fit, tmp_path_factory):
    out = shutil.copytree(eight, tmp_path_factory.mktemp("spanning") / "bundle")
    assert main([str(out), "--texts", str(fit), "--sizes", "20", "8", "--span", "--keep-axes"]) == 0
    return out


def test_the_axes_span_the_vectors_and_keep_the_stored_ones(eight, spanning):
    entry = load_manifest(spanning)["matryoshka_projection"]
    assert load_manifest(spanning)["matryoshka_dims"] == [PROJ_DIM, 20, 8]
    assert 8 < entry["axes"] <= SPAN_AT_MOST and entry["spans_the_vector"] is True
    assert 0 <= entry["residual"] < 1e-2
    axes = np.load(spanning / PROJECTION_FILE)
    assert axes.shape == (PROJ_DIM, entry["axes"])
    np.testing.assert_array_equal(axes[:, :8], np.load(eight / PROJECTION_FILE))  # bit for bit
    a = axes.astype(np.float64)
    np.testing.assert_allclose(a.T @ a, np.eye(entry["axes"]), atol=3e-3)  # the new ones orthogonal too


def test_every_size_short_of_the_whole_is_served(eight, spanning):
    enc, before = Encoder(spanning), Encoder(eight)
    assert enc.dimensions_up_to == PROJ_DIM - 1 and before.dimensions_up_to == 8
    whole = enc.encode(TEXTS, normalize=True)
    k = load_manifest(spanning)["matryoshka_projection"]["axes"]
    axes = np.load(spanning / PROJECTION_FILE).astype(np.float32)
    for m in (k + 1, 20, PROJ_DIM - 1):  # past the axes: the coordinates on all of them, then zeros
        got = enc.encode(TEXTS, dimensions=m, normalize=True)
        assert got.shape == (len(TEXTS), m) and not got[:, k:].any()
        np.testing.assert_allclose(got[:, :k], unit(whole @ axes), atol=1e-5)
        np.testing.assert_allclose(got @ got.T, whole @ whole.T, atol=2e-3)  # the same vectors' cosines
        with pytest.raises(ValueError, match=r"any from 1 to 8"):
            before.encode(TEXTS, dimensions=m)  # the bundle before: refused
    for m in (1, 5, 8):  # the sizes served before: the same vectors
        np.testing.assert_allclose(enc.encode(TEXTS, dimensions=m, normalize=True),
                                   before.encode(TEXTS, dimensions=m, normalize=True), atol=1e-6)
    np.testing.assert_allclose(enc.encode(TEXTS, dimensions=PROJ_DIM), enc.encode(TEXTS))
    for bad in (0, PROJ_DIM + 1):
        with pytest.raises(ValueError, match=rf"this model serves: any from 1 to {PROJ_DIM} \(measured"):
            enc.encode(TEXTS, dimensions=bad)


def test_service_and_bundle_diff(eight, spanning):
    from fastapi.testclient import TestClient

    from service.main import create_app
    from service.settings import Settings

    want = Encoder(spanning).encode(TEXTS, dimensions=20, normalize=True)
    with TestClient(create_app(Settings(bundle=spanning))) as c:
        wait_ready(c.get)
        assert c.get("/info").json()["dimensions_up_to"] == PROJ_DIM - 1
        body = {"input": TEXTS, "model": c.get("/info").json()["model"], "dimensions": 20}
        got = c.post("/v1/embeddings", json=body).json()
        np.testing.assert_allclose([d["embedding"] for d in got["data"]], want, atol=1e-5)
        r = c.post("/v1/embeddings", json={**body, "dimensions": PROJ_DIM + 1})
        assert r.status_code == 422 and f"any from 1 to {PROJ_DIM} (measured" in r.json()["error"]["message"]
        schema = c.get("/openapi.json").json()["components"]["schemas"]["OpenAIEmbeddingsRequest"]
        assert schema["properties"]["dimensions"]["anyOf"] == [
            {"type": "integer", "minimum": 1, "maximum": PROJ_DIM}, {"type": "null"}]
    diff = compare(eight, spanning)["dimensions"]
    assert diff["status"] == "same" and diff["changed"] == [] and diff["compared"] == [8]
    assert diff["only_new"] == [20] and diff["up_to"] == {"old": 8, "new": PROJ_DIM - 1}


def test_refusals(eight, fit, tiny_bundle, tmp_path, capsys):
    other = tmp_path / "other.txt"
    other.write_text("\n".join(fit.read_text().splitlines()[::-1]))
    copy = shutil.copytree(eight, tmp_path / "eight")
    assert main([str(copy), "--texts", str(other), "--sizes", "20", "--span", "--keep-axes"]) == 2
    assert "fitted on other texts" in capsys.readouterr().err
    assert main([str(copy), "--texts", str(fit), "--sizes", "4", "--keep-axes"]) == 2  # fewer than stored
    assert "stores 8 axes" in capsys.readouterr().err
    few = tmp_path / "few.txt"
    few.write_text("\n".join(fit.read_text().splitlines()[:10]))
    assert main([str(copy), "--texts", str(few), "--sizes", "8", "--span"]) == 2
    assert "more texts than the vector has directions" in capsys.readouterr().err
    nli = shutil.copytree(tiny_bundle, tmp_path / "nli")  # its vectors have every direction
    assert main([str(nli), "--texts", str(fit), "--sizes", "4", "--span"]) == 2
    assert "no size past the axes" in capsys.readouterr().err
    assert load_projection(copy, load_manifest(copy)).shape == (PROJ_DIM, 8)  # left as it was
