"""`python -m model_export.dimensions` (disan.bundle.dimensions): a bundle whose encoder
was not trained with Matryoshka prefixes serves shorter vectors as coordinates on the principal
axes of its vectors, through `disan.Encoder`, /embed, /v1/embeddings, TEI and the evaluation."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from conftest import WORDS  # noqa: E402
from support_serving import wait_ready  # noqa: E402

from disan import Encoder  # noqa: E402
from disan.bundle.dimensions import PROJECTION_FILE, load_projection, principal_axes, shorten  # noqa: E402
from disan.bundle.manifest import MANIFEST_NAME, BundleError, load_manifest  # noqa: E402
from model_export.dimensions import main  # noqa: E402

TEXTS = ["a man is playing guitar", "the movie was great !", "dogs run in the park",
         "the woman is not reading a book at the table in the rain"]


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def fit_texts(n: int = 300) -> list[str]:
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 12)))) for _ in range(n)]


@pytest.fixture(scope="module")
def projected(tiny_bundle, tmp_path_factory):
    """A copy of the tiny bundle given dimensions [D, D/2, D/4] by the command."""
    import shutil

    out = shutil.copytree(tiny_bundle, tmp_path_factory.mktemp("dims") / "bundle")
    texts = tmp_path_factory.mktemp("texts") / "fit.txt"
    texts.write_text("\n".join(fit_texts()) + "\n")
    dim = load_manifest(out)["embedding_dim"]
    assert main([str(out), "--texts", str(texts), "--sizes", str(dim // 4), str(dim // 2)]) == 0
    return out


def test_the_command_writes_the_axes_and_the_manifest(projected, tiny_bundle):
    manifest = load_manifest(projected)  # the new file is hashed and checks
    dim = manifest["embedding_dim"]
    assert manifest["matryoshka_dims"] == [dim, dim // 2, dim // 4]
    entry = manifest["matryoshka_projection"]
    assert entry["file"] == PROJECTION_FILE and entry["axes"] == dim // 2 and entry["fit_texts"] > 100
    assert PROJECTION_FILE in manifest["files"]
    axes = np.load(projected / PROJECTION_FILE)
    assert axes.dtype == np.float16 and axes.shape == (dim, dim // 2)
    a = axes.astype(np.float32)
    np.testing.assert_allclose(a.T @ a, np.eye(dim // 2), atol=2e-3)
    # nothing else of the bundle changed
    before = load_manifest(tiny_bundle)
    assert {k: v for k, v in manifest["files"].items() if k != PROJECTION_FILE} == before["files"]
    assert manifest["graphs"] == before["graphs"]


def test_encoder_serves_the_coordinates_on_the_axes(projected, tiny_bundle):
    enc = Encoder(projected)
    dim, axes = enc.dim, load_projection(projected, load_manifest(projected))
    assert enc.matryoshka_dims == [dim, dim // 2, dim // 4]
    whole = enc.encode(TEXTS)
    np.testing.assert_allclose(whole, Encoder(tiny_bundle).encode(TEXTS), atol=1e-6)  # whole: as before
    for m in (dim // 2, dim // 4):
        got = enc.encode(TEXTS, dimensions=m, normalize=True)
        assert got.shape == (len(TEXTS), m)
        np.testing.assert_allclose(got, unit(whole @ axes[:, :m]), atol=1e-5)
        assert not np.allclose(got, unit(whole[:, :m]), atol=1e-3)  # not a prefix
    assert enc.dimensions_up_to == dim // 2
    # any size up to the axes' count: the coordinates on that many axes (not only the listed sizes)
    for m in (1, 3, dim // 2 - 1):
        np.testing.assert_allclose(enc.encode(TEXTS, dimensions=m, normalize=True),
                                   unit(whole @ axes[:, :m]), atol=1e-5)
    for bad in (0, dim // 2 + 1, dim - 1, dim + 1):  # past the axes: only the whole vector
        with pytest.raises(ValueError, match=rf"{dim} or any from 1 to {dim // 2} \(measured"):
            enc.encode(TEXTS, dimensions=bad)


def test_the_leading_axes_keep_more_than_a_prefix(projected):
    """The point of the axes: on texts like the fit texts, cosines at m dimensions stay closer to
    the whole vector's than a prefix's do."""
    enc = Encoder(projected)
    m = enc.dim // 4
    v = unit(enc.encode(fit_texts(120)[60:]))
    full = v @ v.T
    axes = load_projection(projected, load_manifest(projected))
    err = lambda short: np.abs(unit(short) @ unit(short).T - full).mean()  # noqa: E731
    assert err(shorten(v, m, axes)) < err(shorten(v, m, None))


def test_service_routes_and_info(projected):
    from fastapi.testclient import TestClient

    from service.main import create_app
    from service.settings import Settings

    enc = Encoder(projected)
    m = enc.dim // 2
    want = enc.encode(TEXTS, dimensions=m, normalize=True)
    with TestClient(create_app(Settings(bundle=projected))) as c:
        wait_ready(c.get)
        info = c.get("/info").json()
        assert info["matryoshka_dims"] == enc.matryoshka_dims and info["dimensions_by"] == "principal_axes"
        ours = c.post("/embed", json={"texts": TEXTS, "dimensions": m, "normalize": True}).json()
        np.testing.assert_allclose(ours["embeddings"], want, atol=1e-5)
        body = {"input": TEXTS, "model": info["model"], "dimensions": m}
        openai = c.post("/v1/embeddings", json=body).json()
        np.testing.assert_allclose([d["embedding"] for d in openai["data"]], want, atol=1e-5)
        tei = c.post("/embed", json={"inputs": TEXTS, "dimensions": m}).json()
        np.testing.assert_allclose(tei, want, atol=1e-5)
        # a size between the listed ones: served on every route, and the schema says which
        assert info["dimensions_up_to"] == m
        odd = enc.encode(TEXTS, dimensions=3, normalize=True)
        got = c.post("/v1/embeddings", json={**body, "dimensions": 3}).json()
        np.testing.assert_allclose([d["embedding"] for d in got["data"]], odd, atol=1e-5)
        np.testing.assert_allclose(c.post("/embed", json={"inputs": TEXTS, "dimensions": 3}).json(), odd,
                                   atol=1e-5)
        r = c.post("/v1/embeddings", json={**body, "dimensions": m + 1})
        assert r.status_code == 422 and f"any from 1 to {m}" in r.json()["error"]["message"], r.text
        schema = c.get("/openapi.json").json()["components"]["schemas"]["OpenAIEmbeddingsRequest"]
        assert {"type": "integer", "minimum": 1, "maximum": m} in schema["properties"]["dimensions"]["anyOf"]


def test_prefix_bundles_say_so(tiny_bundle):
    from fastapi.testclient import TestClient

    from service.main import create_app
    from service.settings import Settings

    with TestClient(create_app(Settings(bundle=tiny_bundle))) as c:
        wait_ready(c.get)
        assert c.get("/info").json()["dimensions_by"] == "prefix"


def test_retrieval_evaluation_scores_the_served_sizes(projected):
    pytest.importorskip("pytrec_eval")
    from disan.eval.retrieval import RetrievalSet, evaluate_set

    enc = Encoder(projected)
    m = enc.dim // 4
    docs, queries = TEXTS, ["guitar man", "rain book"]
    qrels = {"q0": {"d0": 1}, "q1": {"d3": 1}}
    ids = [f"d{i}" for i in range(4)]
    dataset = RetrievalSet("toy", projected, {}, ids, docs, ["q0", "q1"], queries, qrels)
    axes = load_projection(projected, load_manifest(projected))
    got = evaluate_set(dataset, enc.encode, dimensions=[m], projection=axes)["dimensions"][str(m)]
    served = evaluate_set(dataset, lambda t: enc.encode(t, dimensions=m, normalize=True))
    assert got == {k: served[k] for k in got}


def test_refusals(projected, bundle_copy, tmp_path):
    texts = tmp_path / "t.txt"
    texts.write_text("\n".join(fit_texts(50)))
    dim = load_manifest(bundle_copy)["embedding_dim"]
    run = lambda *sizes: main([str(bundle_copy), "--texts", str(texts),  # noqa: E731
                               "--sizes", *map(str, sizes)])
    assert run(dim) == 2  # not shorter than the vector
    few = tmp_path / "few.txt"
    few.write_text("a man\na dog\na cat\n")
    assert main([str(bundle_copy), "--texts", str(few), "--sizes", str(dim // 2)]) == 2
    assert "matryoshka_projection" not in json.loads((bundle_copy / MANIFEST_NAME).read_text())
    trained = json.loads((bundle_copy / MANIFEST_NAME).read_text())
    trained["matryoshka_dims"] = [dim, dim // 2]  # an encoder trained with prefixes
    (bundle_copy / MANIFEST_NAME).write_text(json.dumps(trained))
    assert run(dim // 4) == 2
    np.save(tmp_path / PROJECTION_FILE, np.zeros((3, 3), dtype=np.float16))
    broken = {**load_manifest(projected), "files": {PROJECTION_FILE: "x"}}
    with pytest.raises(BundleError, match="shape"):
        load_projection(tmp_path, broken)


def test_principal_axes_find_the_strong_directions():
    rng = np.random.default_rng(1)
    basis = np.linalg.qr(rng.normal(size=(6, 6)))[0]
    x = rng.normal(size=(500, 6)) * np.array([10, 5, 1, 0.1, 0.01, 0.001]) @ basis.T
    axes = principal_axes(x, 2)
    assert np.abs(np.abs(axes.T @ basis[:, :2]) - np.eye(2)).max() < 2e-2
    assert (axes[np.abs(axes).argmax(axis=0), [0, 1]] > 0).all()
    with pytest.raises(ValueError, match="k="):
        principal_axes(x, 7)


def test_bundle_diff_reports_how_shorter_sizes_are_made(projected, tiny_bundle, tmp_path):
    pytest.importorskip("onnx")
    import shutil

    from model_export.bundle_diff import compare

    dim = load_manifest(tiny_bundle)["embedding_dim"]
    added = compare(tiny_bundle, projected)
    assert added["changed"] == [] and added["dimensions"]["only_new"] == [dim // 2, dim // 4]
    prefixes = shutil.copytree(tiny_bundle, tmp_path / "prefixes")  # the same graphs, trained prefixes
    manifest = json.loads((prefixes / MANIFEST_NAME).read_text())
    manifest["matryoshka_dims"] = [dim, dim // 2, dim // 4]
    (prefixes / MANIFEST_NAME).write_text(json.dumps(manifest))
    moved = compare(prefixes, projected)
    assert moved["dimensions"]["changed"] == [dim // 2, dim // 4]
    assert moved["changed"] == ["embed dimensions"]
    assert moved["dimensions"]["up_to"] == {"old": 0, "new": dim // 2}
    # the same axes, but fewer sizes served at will: a client's dimensions=dim//2 - 1 would be refused
    fewer = shutil.copytree(projected, tmp_path / "fewer")
    manifest = json.loads((fewer / MANIFEST_NAME).read_text())
    manifest["matryoshka_projection"]["axes"] = dim // 4
    (fewer / MANIFEST_NAME).write_text(json.dumps(manifest))
    narrower = compare(projected, fewer)
    assert narrower["dimensions"]["changed"] == [] and narrower["dimensions"]["narrower"]
    assert narrower["changed"] == ["embed dimensions"]
    assert compare(fewer, projected)["changed"] == []  # more sizes: nothing a client has breaks


def test_disan_embed_writes_the_served_size(projected, tmp_path, capsys):
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from disan.cli import main as disan_main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    m = load_manifest(projected)["embedding_dim"] // 4
    out = tmp_path / "vectors"
    assert disan_main(["embed", str(corpus), "-o", str(out), "--bundle", str(projected), "--normalize",
                       "--dimensions", str(m), "--no-progress"]) == 0
    table = pq.read_table(sorted(out.glob("part-*"))[0])
    got = np.asarray(table.column("embedding").to_pylist(), dtype=np.float32)
    np.testing.assert_allclose(got, Encoder(projected).encode(TEXTS, dimensions=m, normalize=True), atol=1e-5)
    assert disan_main(["embed", str(corpus), "-o", str(tmp_path / "three"), "--bundle", str(projected),
                       "--normalize", "--dimensions", "3", "--no-progress"]) == 0  # any size up to the axes
    table = pq.read_table(sorted((tmp_path / "three").glob("part-*"))[0])
    np.testing.assert_allclose(np.asarray(table.column("embedding").to_pylist(), dtype=np.float32),
                               Encoder(projected).encode(TEXTS, dimensions=3, normalize=True), atol=1e-5)
    past = 2 * m + 1  # past the axes, short of the whole vector
    assert disan_main(["embed", str(corpus), "-o", str(tmp_path / "other"), "--bundle", str(projected),
                       "--dimensions", str(past)]) == 2
    assert f"dimensions: {past} is not a size this model serves" in capsys.readouterr().err


def test_disan_embed_refuses_to_resume_with_other_axes(projected, tmp_path, capsys):
    """The embed fingerprint does not cover the principal axes: a job of shorter vectors records
    them, so its output is not continued with vectors made another way; a job of the whole size
    (named with --dimensions) depends on none and goes on."""
    pytest.importorskip("pyarrow")
    import shutil

    from disan.cli import main as disan_main

    bundle = shutil.copytree(projected, tmp_path / "bundle")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    m = load_manifest(bundle)["embedding_dim"] // 4
    args = ["embed", str(corpus), "-o", str(tmp_path / "vectors"), "--bundle", str(bundle),
            "--dimensions", str(m), "--no-progress"]
    assert disan_main(args) == 0
    refit = tmp_path / "refit.txt"
    refit.write_text("\n".join(fit_texts(300)[::-1][:200]) + "\n")
    whole = ["embed", str(corpus), "-o", str(tmp_path / "whole"), "--bundle", str(bundle),  # D, named
             "--dimensions", str(load_manifest(bundle)["embedding_dim"]), "--no-progress"]
    assert disan_main(whole) == 0
    assert main([str(bundle), "--texts", str(refit), "--sizes", str(m)]) == 0
    assert disan_main(args) == 2
    assert "dimensions_axes" in capsys.readouterr().err
    assert disan_main(whole) == 0  # the whole vector depends on no axes: the job goes on


def test_evaluation_refuses_sizes_past_the_axes(projected, tmp_path, capsys):
    """`disan eval --sts|--retrieval --dimensions m` with m past the bundle's axes once scored the
    largest vector the axes make under m's name; now it stops before embedding anything."""
    from disan.cli import main as disan_main

    dim = load_manifest(projected)["embedding_dim"]
    past = dim // 2 + 1
    folder = tmp_path / "toy"
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n"
                                                 for i, t in enumerate(TEXTS)))
    (folder / "queries.jsonl").write_text(json.dumps({"_id": "q0", "text": "guitar"}) + "\n")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n")
    for flags in (["--sts", "--data", str(tmp_path), "--sts-baselines", "", "--out-dir", str(tmp_path / "o")],
                  ["--retrieval", str(folder)]):
        sizes = ["--dimensions", str(dim // 4), str(past)]
        code = disan_main(["eval", *flags, "--bundle", str(projected), *sizes])
        err = capsys.readouterr().err
        assert code == 2 and f"--dimensions {past}: " in err and f"up to its {dim // 2} principal axes" in err
    axes = load_projection(projected, load_manifest(projected))
    with pytest.raises(ValueError, match="principal axes"):
        shorten(np.ones((1, dim), np.float32), past, axes)
