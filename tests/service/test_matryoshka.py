"""Matryoshka vectors (issue 80 item 4): `dimensions` is a prefix of the served vector, then
normalised; the manifest's `matryoshka_dims` are the sizes served and any other is refused naming
them (`disan.Encoder.encode`, /embed, /v1/embeddings through both front ends, the openai client)."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from support_serving import serve_in_thread, wait_ready  # noqa: E402

from disan import Encoder  # noqa: E402
from disan.bundle.manifest import MANIFEST_NAME, BundleError, load_manifest, matryoshka_dims  # noqa: E402
from service.common.errors import ERROR_TABLE  # noqa: E402

TEXTS = ["a man is playing guitar", "the movie was great !", "dogs run in the park", "a",
         "the woman is not reading a book at the table in the rain"]


def unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def nested_bundle(tiny_bundle, tmp_path_factory) -> Path:
    """The tiny bundle whose manifest says its encoder was trained for [D, D/2, D/4] (the manifest
    is not among the hashed files, so only it changes)."""
    out = Path(shutil.copytree(tiny_bundle, tmp_path_factory.mktemp("nested") / "bundle"))
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    dim = manifest["embedding_dim"]
    assert dim >= 8 and dim % 4 == 0
    manifest["matryoshka_dims"] = [dim, dim // 2, dim // 4]
    (out / MANIFEST_NAME).write_text(json.dumps(manifest))
    return out


@pytest.fixture(scope="module")
def sizes(nested_bundle) -> list[int]:
    return load_manifest(nested_bundle)["matryoshka_dims"]


# ---------------------------------------------------------------- the manifest
def test_without_the_key_the_only_size_is_the_whole_vector(tiny_bundle):
    manifest = load_manifest(tiny_bundle)
    assert "matryoshka_dims" not in manifest  # today's export does not write it
    assert matryoshka_dims(manifest) == [manifest["embedding_dim"]]
    assert matryoshka_dims(manifest, dim=7) == [7]


@pytest.mark.parametrize("bad", [[8, 16], [16, 16, 8], [16, 0], [16, 8.0], [12, 8], [], "16", [True]])
def test_sizes_that_are_not_prefixes_of_the_vector_are_refused(bad):
    with pytest.raises(BundleError, match="matryoshka_dims"):
        matryoshka_dims({"embedding_dim": 16, "matryoshka_dims": bad})


def test_a_bundle_with_bad_sizes_does_not_load(nested_bundle, tmp_path):
    broken = Path(shutil.copytree(nested_bundle, tmp_path / "broken"))
    manifest = json.loads((broken / MANIFEST_NAME).read_text())
    manifest["matryoshka_dims"] = manifest["matryoshka_dims"][::-1]
    (broken / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="largest first"):
        load_manifest(broken)


# ---------------------------------------------------------------- disan.Encoder
@pytest.fixture(scope="module")
def encoder(nested_bundle) -> Encoder:
    return Encoder(nested_bundle)


def test_encode_prefix_then_normalise(encoder, sizes):
    assert encoder.matryoshka_dims == sizes
    full = encoder.encode(TEXTS)
    for m in sizes:
        cut = encoder.encode(TEXTS, dimensions=m, normalize=True)
        assert cut.shape == (len(TEXTS), m) and cut.dtype == np.float32
        # the first m components of the raw vector, normalised: not the normalised vector cut
        np.testing.assert_allclose(cut, unit(full[:, :m]), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-5)
        np.testing.assert_allclose(encoder.encode(TEXTS, dimensions=m), full[:, :m], rtol=1e-5, atol=1e-6)
    one = encoder.encode(TEXTS[0], dimensions=sizes[-1], normalize=True)
    assert one.shape == (sizes[-1],)
    assert np.concatenate(list(encoder.iter_encode(TEXTS, chunk=2, dimensions=sizes[1]))).shape == \
        (len(TEXTS), sizes[1])


@pytest.mark.parametrize("bad", [3, 0, -8, 10_000])
def test_encode_refuses_other_sizes_naming_the_trained_ones(encoder, sizes, bad):
    with pytest.raises(ValueError, match=str(sizes).replace("[", r"\[").replace("]", r"\]")):
        encoder.encode(TEXTS, dimensions=bad)


def test_encode_refuses_a_size_that_is_not_an_integer(encoder, sizes):
    with pytest.raises(ValueError, match="an integer"):
        encoder.encode(TEXTS, dimensions=float(sizes[1]))  # type: ignore[arg-type]


def test_a_bundle_without_sizes_serves_only_its_dim(tiny_bundle):
    enc = Encoder(tiny_bundle)
    dim = enc.dim
    assert enc.matryoshka_dims == [dim]
    np.testing.assert_array_equal(enc.encode(TEXTS, dimensions=dim, normalize=True),
                                  enc.encode(TEXTS, normalize=True))
    with pytest.raises(ValueError, match=rf"the sizes are \[{dim}\]"):
        enc.encode(TEXTS, dimensions=dim // 2)


# ---------------------------------------------------------------- the service
@pytest.fixture(scope="module", params=[True, False], ids=["fastpath", "fastapi"])
def client(nested_bundle, request):
    from fastapi.testclient import TestClient

    from service.main import create_app
    from service.settings import Settings

    with TestClient(create_app(Settings(bundle=nested_bundle, max_wait_ms=1.0,
                                        fast_path=request.param))) as c:
        wait_ready(c.get)
        yield c


def refused(r, sizes: list[int]) -> str:
    """A refused size: the table's 422 in the route family's body, naming the trained sizes."""
    assert r.status_code == ERROR_TABLE["invalid_request"][0] == 422, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == "invalid_request" and str(sizes) in body["error"]["message"]
    return body["error"]["message"]


def raw(client, texts: list[str]) -> np.ndarray:
    r = client.post("/embed", json={"texts": texts})
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["embeddings"], dtype=np.float32)


def test_info_and_openapi_list_the_sizes(client, sizes):
    assert client.get("/info").json()["matryoshka_dims"] == sizes
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    for name in ("EmbedRequest", "OpenAIEmbeddingsRequest"):
        assert {"type": "integer", "enum": sizes} in schemas[name]["properties"]["dimensions"]["anyOf"]


def test_embed_dimensions_prefix_then_normalise(client, sizes):
    full = raw(client, TEXTS)
    for m in sizes:
        for normalize in (False, True):
            r = client.post("/embed", json={"texts": TEXTS, "dimensions": m, "normalize": normalize})
            assert r.status_code == 200, r.text
            assert r.json()["dim"] == m
            got = np.asarray(r.json()["embeddings"])
            want = unit(full[:, :m]) if normalize else full[:, :m]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    r = client.post("/embed", json={"texts": TEXTS, "dimensions": sizes[-1], "normalize": True,
                                    "encoding_format": "base64"})
    decoded = np.stack([np.frombuffer(base64.b64decode(e), dtype="<f4") for e in r.json()["embeddings"]])
    np.testing.assert_allclose(decoded, unit(full[:, :sizes[-1]]), rtol=1e-5, atol=1e-6)
    r = client.post("/embed", json={"texts": TEXTS[:2], "dimensions": sizes[1], "explain": True,
                                    "normalize": True})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.asarray(r.json()["embeddings"]), unit(full[:2, :sizes[1]]),
                               rtol=1e-5, atol=1e-6)
    assert len(r.json()["explanations"]) == 2


def test_v1_dimensions_prefix_then_normalise_float_and_base64(client, sizes):
    full = raw(client, TEXTS)
    for m in sizes:
        r = client.post("/v1/embeddings", json={"input": TEXTS, "dimensions": m})
        assert r.status_code == 200, r.text
        got = np.asarray([d["embedding"] for d in r.json()["data"]])
        assert got.shape == (len(TEXTS), m)
        np.testing.assert_allclose(got, unit(full[:, :m]), rtol=1e-5, atol=1e-6)
        b = client.post("/v1/embeddings", json={"input": TEXTS[0], "dimensions": m,
                                                "encoding_format": "base64"}).json()
        decoded = np.frombuffer(base64.b64decode(b["data"][0]["embedding"]), dtype="<f4")
        np.testing.assert_allclose(decoded, unit(full[0, :m]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", [3, 0, -8, 10_000])
def test_other_sizes_are_a_422_naming_the_trained_ones(client, sizes, bad):
    refused(client.post("/v1/embeddings", json={"input": TEXTS, "dimensions": bad}), sizes)
    refused(client.post("/embed", json={"texts": TEXTS, "dimensions": bad}), sizes)


@pytest.mark.parametrize("bad", ["8", 8.0, True, [8]])
def test_a_dimensions_that_is_not_an_integer_is_a_422(client, bad):
    for path, body in (("/v1/embeddings", {"input": "a"}), ("/embed", {"texts": ["a"]})):
        r = client.post(path, json={**body, "dimensions": bad})
        assert r.status_code == 422 and r.json()["error"]["type"] == "invalid_request", r.text
        assert "dimensions" in r.json()["error"]["message"]


def test_a_bundle_without_sizes_takes_its_dim_and_names_it_when_refusing(tiny_bundle):
    from fastapi.testclient import TestClient

    from service.main import create_app
    from service.settings import Settings

    with TestClient(create_app(Settings(bundle=tiny_bundle, max_wait_ms=1.0))) as c:
        wait_ready(c.get)
        dim = c.get("/info").json()["dim"]
        assert c.get("/info").json()["matryoshka_dims"] == [dim]
        whole = c.post("/v1/embeddings", json={"input": TEXTS}).json()
        same = c.post("/v1/embeddings", json={"input": TEXTS, "dimensions": dim}).json()
        assert same["data"] == whole["data"]
        message = refused(c.post("/v1/embeddings", json={"input": TEXTS, "dimensions": dim // 2}), [dim])
        assert f"{dim // 2} is not a size" in message
        refused(c.post("/embed", json={"texts": TEXTS, "dimensions": dim // 2}), [dim])


def test_openai_client_dimensions(nested_bundle, sizes):
    """The openai SDK's `dimensions=` (it asks for base64 unless told otherwise) against a live server."""
    openai = pytest.importorskip("openai")
    import httpx

    from service.settings import Settings

    with serve_in_thread(Settings(bundle=nested_bundle)) as base:
        full = np.asarray(httpx.post(f"{base}/embed", json={"texts": TEXTS}).json()["embeddings"],
                          dtype=np.float32)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
        for m in sizes:
            for fmt in ("float", "base64"):
                got = client.embeddings.create(model="text-embedding-3-small", input=TEXTS, dimensions=m,
                                               encoding_format=fmt)
                vectors = [d.embedding for d in got.data]
                if fmt == "base64":  # the SDK hands base64 back as sent when asked for it
                    vectors = [np.frombuffer(base64.b64decode(v), dtype="<f4") for v in vectors]
                np.testing.assert_allclose(vectors, unit(full[:, :m]), rtol=1e-5, atol=1e-6)
            default = client.embeddings.create(model="text-embedding-3-small", input=TEXTS[0], dimensions=m)
            assert len(default.data[0].embedding) == m
        with pytest.raises(openai.UnprocessableEntityError) as no:
            client.embeddings.create(model="text-embedding-3-small", input=TEXTS, dimensions=3)
        assert str(sizes) in str(no.value)
