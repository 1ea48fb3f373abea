"""model_export/bundle_diff.py: which routes of two bundles compute the same thing."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

onnx = pytest.importorskip("onnx")

from disan.bundle.manifest import load_manifest, write_manifest  # noqa: E402
from disan.cli import main as disan_main  # noqa: E402
from model_export.bundle_diff import compare, route_fingerprints, run  # noqa: E402

PAD = 64  # bytes put in front of weights.data: every offset moves, no weight changes


def graph_files(bundle: Path) -> list[Path]:
    return sorted(bundle.glob("*.onnx"))


def external(model) -> list:
    return [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]


def rehash(bundle: Path) -> None:
    """The manifest's file hashes brought up to date (load_manifest checks them)."""
    write_manifest(bundle, load_manifest(bundle, verify_hashes=False))


def move_weights(bundle: Path) -> None:
    """weights.data with PAD bytes in front and every graph's offsets moved to match."""
    data = bundle / "weights.data"
    data.write_bytes(b"\0" * PAD + data.read_bytes())
    for path in graph_files(bundle):
        model = onnx.load(str(path), load_external_data=False)
        for tensor in external(model):
            for entry in tensor.external_data:
                if entry.key == "offset":
                    entry.value = str(int(entry.value) + PAD)
        onnx.save(model, str(path))
    rehash(bundle)


def change_a_sentiment_weight(bundle: Path) -> str:
    """Flip one byte of an initializer only the sentiment model's graphs read; its name."""
    model = onnx.load(str(bundle / "sentiment.onnx"), load_external_data=False)
    tensor = next(t for t in external(model) if t.name.startswith("sentiment/"))
    where = {e.key: int(e.value) for e in tensor.external_data if e.key in ("offset", "length")}
    with open(bundle / "weights.data", "r+b") as f:
        f.seek(where["offset"] + where["length"] // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    rehash(bundle)
    return tensor.name


def statuses(report: dict) -> dict[str, str]:
    return {route: row["status"] for route, row in report["routes"].items()}


def test_a_bundle_and_its_copy_are_the_same_on_every_route(tiny_bundle, bundle_copy, tmp_path, capsys):
    out = tmp_path / "diff.json"
    code = run(argparse.Namespace(old=tiny_bundle, new=bundle_copy, routes=None, json=out))
    report = json.loads(out.read_text())
    assert code == 0 and report["changed"] == []
    assert set(statuses(report).values()) == {"same"} and "embed" in report["routes"]
    assert all(row["compared"] for row in report["routes"].values())
    assert "embed" in capsys.readouterr().out


def test_export_records_what_bundle_diff_computes(tiny_bundle):
    recorded = load_manifest(tiny_bundle)["route_fingerprints"]
    assert recorded == route_fingerprints(tiny_bundle)
    assert {"embed", "nli", "nli_head", "sentiment"} <= set(recorded)
    assert recorded["embed"]["cpu/fp32"] != recorded["embed"]["gpu/fp16"]  # another graph, another sum


def test_weights_moved_within_the_file_are_the_same_computation(tiny_bundle, bundle_copy):
    move_weights(bundle_copy)
    # every graph file and weights.data now differ byte for byte: a file comparison says changed
    assert all(p.read_bytes() != (tiny_bundle / p.name).read_bytes() for p in graph_files(bundle_copy))
    assert set(statuses(compare(tiny_bundle, bundle_copy)).values()) == {"same"}


def test_a_changed_sentiment_weight_changes_only_the_sentiment_routes(tiny_bundle, bundle_copy):
    change_a_sentiment_weight(bundle_copy)
    # the graph files are untouched: only the bytes they point at differ
    assert all(p.read_bytes() == (tiny_bundle / p.name).read_bytes() for p in graph_files(bundle_copy))
    got = statuses(compare(tiny_bundle, bundle_copy))
    assert got.pop("sentiment") == "changed"
    assert got.pop("sentiment_explain", "changed") == "changed"
    assert set(got.values()) == {"same"}, got  # embed, nli, nli_head: an index stays valid


def test_a_changed_vocabulary_changes_every_route(tiny_bundle, bundle_copy):
    vocab = json.loads((bundle_copy / "vocab.json").read_text())
    vocab["itos"][2], vocab["itos"][3] = vocab["itos"][3], vocab["itos"][2]
    (bundle_copy / "vocab.json").write_text(json.dumps(vocab))
    rehash(bundle_copy)
    assert set(statuses(compare(tiny_bundle, bundle_copy)).values()) == {"changed"}


def test_the_same_vocabulary_written_in_another_layout_is_the_same_on_every_route(tiny_bundle, bundle_copy):
    # export writes vocab.json compact since 2026-12-06; the words and their ids are what a route reads
    rewritten = []
    for name in ("vocab.json", "tokenizer.json"):
        path = bundle_copy / name
        if path.exists():
            path.write_text(json.dumps(json.loads(path.read_text()), indent=1))
            rewritten.append(name)
    rehash(bundle_copy)
    assert "vocab.json" in rewritten
    assert all((bundle_copy / n).read_bytes() != (tiny_bundle / n).read_bytes() for n in rewritten)
    assert set(statuses(compare(tiny_bundle, bundle_copy)).values()) == {"same"}


def test_only_the_asked_routes_and_the_exit_status(tiny_bundle, bundle_copy, capsys):
    change_a_sentiment_weight(bundle_copy)
    assert disan_main(["bundle-diff", str(tiny_bundle), str(bundle_copy), "--routes", "embed", "nli"]) == 0
    assert disan_main(["bundle-diff", str(tiny_bundle), str(bundle_copy), "--routes", "sentiment"]) == 1
    lines = capsys.readouterr().out.splitlines()
    want = [["embed", "same"], ["nli", "same"], ["sentiment", "changed"]]
    assert [line.split()[:2] for line in lines] == want


def test_a_graph_file_that_is_not_onnx_is_one_line(tiny_bundle, bundle_copy, capsys):
    (bundle_copy / "sentiment.onnx").write_bytes(b"not a graph")
    rehash(bundle_copy)  # the manifest vouches for it: only reading it tells
    assert disan_main(["bundle-diff", str(tiny_bundle), str(bundle_copy)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("disan bundle-diff: error:") and "sentiment.onnx: not an ONNX graph" in err
    assert "\n" not in err


@pytest.mark.parametrize("args, says", [
    (["--routes", "nope"], "route"),
    ([], "manifest.json"),
])
def test_trouble_is_one_line_and_exit_status_2(tiny_bundle, tmp_path, capsys, args, says):
    other = tiny_bundle if args else tmp_path  # tmp_path is not a bundle
    assert disan_main(["bundle-diff", str(tiny_bundle), str(other), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("disan bundle-diff: error:") and says in err and "\n" not in err
