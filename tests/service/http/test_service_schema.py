"""Schemathesis against the app's own /openapi.json, in-process and bounded (few examples per route).

Requests go through a TestClient whose lifespan loaded and warmed the tiny bundle, so generated
cases reach the model. Checks: no 5xx, status codes / content types / bodies match the schema,
schema-violating requests are rejected.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from support_serving import wait_ready

from service.main import create_app
from service.settings import Settings

schemathesis = pytest.importorskip("schemathesis")

# The schema is generated from a settings-only app (no bundle needed to describe the API).
schema = schemathesis.openapi.from_dict(create_app(Settings(bundle="unused")).openapi())


@pytest.fixture(scope="module")
def client(tiny_bundle, fast_path):
    # Small limits so generated data exercises the 413/422 rows too, not only the happy path.
    app = create_app(Settings(bundle=tiny_bundle, max_texts_per_request=16, max_chars_per_text=300,
                              max_wait_ms=0.5, fast_path=fast_path))
    with TestClient(app, raise_server_exceptions=False) as c:
        wait_ready(c.get)
        yield c


@schema.parametrize()
@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case, client):
    kwargs = case.as_transport_kwargs(base_url="http://testserver")
    kwargs.pop("cookies", None)  # the API uses none; per-request cookies are deprecated in httpx
    if isinstance(kwargs.get("data"), bytes | str):  # raw bodies (negative cases): httpx wants content=
        kwargs["content"] = kwargs.pop("data")
    response = client.request(**kwargs)
    assert response.status_code < 500, response.text
    # positive_data_acceptance is excluded on purpose: semantic limits the schema cannot state
    # (a text with no tokens, over max_tokens, more texts than the configured limit) rightly turn
    # schema-valid bodies into 413/422. Every other check (5xx, schema, status, headers) applies.
    excluded = [schemathesis.checks.positive_data_acceptance]
    if case.path == "/":  # GET / is the playground (a page, not in the API schema), not a 405
        excluded.append(schemathesis.checks.unsupported_method)
    case.validate_response(response, excluded_checks=excluded)


def test_the_generated_cases_cover_tei_and_rerank_routes():
    """The TEI and rerank routes are in the schema the cases above are generated from: each gets
    bad input as well as good, and must answer it with a 4xx, never a 5xx."""
    paths = schema.raw_schema["paths"]
    for path in ("/", "/embed", "/embed_sparse", "/similarity", "/tokenize", "/decode", "/rerank", "/predict",
                 "/v1/rerank", "/v2/rerank"):
        assert "post" in paths[path], path
    body = paths["/similarity"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert len(body["oneOf"]) == 2  # ours and TEI's, both generated
