"""`python -m model_export.repack`: an older bundle's vocabulary written compact and its route
fingerprints recorded by today's rule, with nothing a route computes changed."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from disan.bundle.manifest import load_manifest, write_manifest  # noqa: E402
from model_export.bundle_diff import compare, route_fingerprints  # noqa: E402
from model_export.repack import main  # noqa: E402
from model_export.verify import fingerprint_check  # noqa: E402


def as_exported_before(bundle) -> None:
    """`bundle` as an export before 2026-12-06 left it: vocab.json with ", " and ": ", and route
    fingerprints that hashed its bytes."""
    path = bundle / "vocab.json"
    path.write_text(json.dumps(json.loads(path.read_text()), ensure_ascii=False))
    manifest = load_manifest(bundle, verify_hashes=False)
    manifest["route_fingerprints"] = route_fingerprints(bundle, manifest, vocab_as_bytes=True)
    write_manifest(bundle, manifest)


def test_an_older_bundle_is_written_compact_and_computes_the_same(tiny_bundle, bundle_copy, capsys):
    as_exported_before(bundle_copy)
    before = (bundle_copy / "vocab.json").stat().st_size
    assert "rule" in fingerprint_check(bundle_copy, load_manifest(bundle_copy))  # the older rule
    assert main([str(bundle_copy)]) == 0
    assert "route fingerprints recorded" in capsys.readouterr().out
    after = bundle_copy / "vocab.json"
    assert after.stat().st_size < before and ", " not in after.read_text()[:200]
    assert after.read_bytes() == (tiny_bundle / "vocab.json").read_bytes()  # what export writes today
    manifest = load_manifest(bundle_copy)  # the files' hashes and sizes written again
    assert fingerprint_check(bundle_copy, manifest) == {"checked": True, "stale": []}  # today's rule
    assert manifest["route_fingerprints"] == load_manifest(tiny_bundle)["route_fingerprints"]
    assert compare(tiny_bundle, bundle_copy)["changed"] == []


def test_a_bundle_whose_fingerprints_neither_rule_computes_is_refused(bundle_copy, capsys):
    manifest = load_manifest(bundle_copy)
    manifest["route_fingerprints"]["nli"]["cpu/fp32"] = "0" * 64
    write_manifest(bundle_copy, manifest)
    vocab = (bundle_copy / "vocab.json").read_bytes()
    assert main([str(bundle_copy)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("repack: error:") and "nli" in err and "export the bundle again" in err
    assert (bundle_copy / "vocab.json").read_bytes() == vocab
