"""`python -m model_export.lexical` (disan.bundle.lexical): a bundle gains a lexical table, serves
sparse vectors through `disan.Encoder.encode_sparse`, and no route of it changes."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from conftest import LEXICAL_TEXTS  # noqa: E402

from disan import Encoder  # noqa: E402
from disan.bundle.lexical import LEXICAL_FILE, sparse_vector  # noqa: E402
from disan.bundle.manifest import MANIFEST_NAME, load_manifest  # noqa: E402
from model_export.bundle_diff import compare  # noqa: E402
from model_export.dimensions import read_texts  # noqa: E402
from model_export.lexical import main  # noqa: E402


def test_the_table_is_listed_in_the_manifest_and_changes_no_route(tiny_bundle, sparse_bundle):
    manifest = load_manifest(sparse_bundle)  # the files' hashes checked, the table's too
    entry = manifest["lexical"]
    assert entry["file"] == LEXICAL_FILE and LEXICAL_FILE in manifest["files"]
    assert entry["bits"] == 2 and entry["fit_texts"] == len(LEXICAL_TEXTS) and entry["scale"] > 0
    assert 0 < entry["ids_seen"] < entry["ids"]
    report = compare(tiny_bundle, sparse_bundle)
    assert report["changed"] == [] and report["sparse"] == "added"
    assert compare(sparse_bundle, tiny_bundle)["changed"] == ["embed sparse"]  # removed breaks clients
    assert compare(sparse_bundle, sparse_bundle)["sparse"] == "same"


def test_encode_sparse_weighs_the_ids_the_encoder_reads(sparse_bundle):
    encoder = Encoder(sparse_bundle, variant="fp32")
    idf = encoder.runtime.idf
    assert idf is not None and len(idf) == len(encoder.runtime.tokenizer("embed"))
    texts = ["the guitar man plays the guitar", "zzzz unseen words"]
    got = encoder.encode_sparse(texts)
    for text, (idx, val), item in zip(texts, got, encoder.prepare(texts).items, strict=True):
        want = sparse_vector(item.ids, idf)
        np.testing.assert_array_equal(idx, want[0])
        np.testing.assert_allclose(val, want[1])
        assert abs(np.linalg.norm(val) - 1) < 1e-6, text
    guitar = encoder.runtime.tokenizer("embed").ids(["guitar"])[0]
    the = encoder.runtime.tokenizer("embed").ids(["the"])[0]
    weights = dict(zip(got[0][0].tolist(), got[0][1].tolist(), strict=True))
    assert weights.get(the, 0.0) < weights[guitar]  # "the" is in 3 of the 5 counted texts
    assert len(encoder.encode_sparse("one text")) == 1


def test_a_long_text_is_weighed_over_all_its_windows(sparse_bundle):
    encoder = Encoder(sparse_bundle, variant="fp32", long_texts="window")
    long_text = "the man is in the park . " * 30 + "guitar"  # the guitar is past the first window
    idx, _ = encoder.encode_sparse([long_text])[0]
    assert encoder.runtime.tokenizer("embed").ids(["guitar"])[0] in idx.tolist()


def test_a_bundle_without_the_table_says_how_to_add_one(tiny_bundle):
    with pytest.raises(ValueError, match="model_export.lexical"):
        Encoder(tiny_bundle, variant="fp32").encode_sparse(["a man"])


def test_the_command_samples_every_nth_line_and_reports_errors(bundle_copy, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(LEXICAL_TEXTS * 2) + "\n\n", encoding="utf-8")
    assert read_texts([corpus], every=2) == LEXICAL_TEXTS[::2]  # distinct lines, every second
    assert main([str(bundle_copy), "--texts", str(corpus), "--every", "2", "--bits", "3"]) == 0
    assert "8 levels" in capsys.readouterr().out
    manifest = json.loads((bundle_copy / MANIFEST_NAME).read_text())
    assert manifest["lexical"]["bits"] == 3 and manifest["lexical"]["fit_texts"] == len(LEXICAL_TEXTS[::2])
    with np.load(bundle_copy / LEXICAL_FILE) as stored:
        assert stored["levels"].max() == 7
    empty = tmp_path / "empty.txt"
    empty.write_text("\n", encoding="utf-8")
    assert main([str(bundle_copy), "--texts", str(empty)]) == 2
    assert "lexical: error: no texts" in capsys.readouterr().err
    assert main([str(bundle_copy), "--texts", str(corpus), "--every", "0"]) == 2
    assert main([str(bundle_copy), "--texts", str(tmp_path / "missing.txt")]) == 2
