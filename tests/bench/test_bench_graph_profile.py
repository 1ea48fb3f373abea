"""bench/graph_profile.py: a bundle graph's onnxruntime node profile, by operator, node and group."""

from __future__ import annotations

import json

import pytest

from bench import graph_profile as bench


def test_shares_of_node_time(tiny_bundle, bench_sentences, tmp_path):
    out = tmp_path / "profile.json"
    assert bench.main(["--bundle", str(tiny_bundle), "--data", str(bench_sentences), "--lengths", "1-10",
                       "--batch", "8", "--runs", "3", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    cpu = json.loads((tiny_bundle / "manifest.json").read_text())["sets"]["cpu"]
    assert report["file"] == cpu["variants"][cpu["default_variant"]]["files"]["encoder"]  # the served file
    assert report["batch"][0] == 8 and report["microseconds_per_run"] > 0
    assert sum(report["by_operator"].values()) == pytest.approx(100, abs=0.1)
    assert "MatMul" in report["by_operator"]
    # the word lookup is a group of its own, a part of the whole
    assert 0 < report["groups"]["embedding"] < 100


def test_the_warm_up_run_is_left_out(tiny_bundle, bench_sentences, monkeypatch):
    """Three runs asked for: the profile holds the nodes of three, not four (the first allocates)."""
    seen = {}
    real = bench.profile

    def count(*args):
        events = real(*args)
        seen["runs"] = sum(e["name"] == events[0]["name"] for e in events)
        return events

    monkeypatch.setattr(bench, "profile", count)
    bench.main(["--bundle", str(tiny_bundle), "--data", str(bench_sentences), "--lengths", "1-10",
                "--batch", "4", "--runs", "3", "--json", str(bench_sentences / "p.json")])
    assert seen["runs"] == 3


def test_a_graph_that_does_not_read_texts_is_refused(tiny_bundle, bench_sentences):
    with pytest.raises(ValueError, match="nli_head"):
        bench.main(["--bundle", str(tiny_bundle), "--data", str(bench_sentences), "--graph", "nli_head",
                    "--json", str(bench_sentences / "p.json")])
    with pytest.raises(ValueError, match="the bundle has"):
        bench.main(["--bundle", str(tiny_bundle), "--data", str(bench_sentences), "--graph", "decoder",
                    "--json", str(bench_sentences / "p.json")])
    for flag, value in [("--lengths", "5-9"), ("--runs", "0"), ("--batch", "-1")]:
        with pytest.raises(SystemExit):  # argparse's one-line error, not a KeyError or a division by 0
            bench.main(["--bundle", str(tiny_bundle), "--data", str(bench_sentences), flag, value,
                        "--json", str(bench_sentences / "p.json")])
    with pytest.raises(ValueError, match="--set 'tpu'"):
        bench.main(["--bundle", str(tiny_bundle), "--data", str(bench_sentences), "--set", "tpu",
                    "--json", str(bench_sentences / "p.json")])


def test_a_scan_body_is_counted_once(tiny_bundle):
    """The profiler reports a Scan and, again, the nodes of its body inside the Scan's time."""
    import onnx

    path = tiny_bundle / "encoder.chunked.onnx"
    graph = onnx.load(str(path), load_external_data=False).graph
    scan = next(n for n in graph.node if n.op_type == "Scan")
    inner = next(a.g for a in scan.attribute if a.type == onnx.AttributeProto.GRAPH).node[0]
    outer = next(n for n in graph.node if n.op_type != "Scan")

    def event(node, op, dur):
        return {"name": node.name + bench.KERNEL, "dur": dur, "args": {"op_name": op}}

    events = [event(inner, inner.op_type, 10), event(scan, "Scan", 15), event(outer, outer.op_type, 5)]
    by_node, by_op = bench.leaf_times(events, path)
    assert by_node[scan.name] == 5 and by_node[inner.name] == 10 and by_node[outer.name] == 5
    assert sum(by_node.values()) == 20 and by_op["Scan"] == 5


def test_a_graph_that_reads_pieces_is_fed_pieces(tiny_bundle, tmp_path):
    """The feed is the ids the graph's own tokenizer gives (a piece encoder's tokenizer.json), not
    the bundle vocabulary's word ids."""
    pytest.importorskip("tokenizers")
    from conftest import tiny_piece_tokenizer

    from disan.bundle.manifest import load_manifest
    from disan.text.tokenizer import Vocab

    pieces = tiny_piece_tokenizer()
    pieces._tok.save(str(tmp_path / "tokenizer.json"))
    manifest = load_manifest(tiny_bundle)
    manifest["graphs"]["encoder"]["tokenizer"] = "tokenizer.json"
    sentences = ["a man is playing guitar", "phytosterol lowers cholesterol"]
    bundle = tmp_path
    (bundle / manifest["vocab"]).write_bytes((tiny_bundle / manifest["vocab"]).read_bytes())
    feed = bench.graph_feed(bundle, manifest, "encoder", sentences)
    assert feed["ids"].tolist() == pieces.encode(sentences).ids.tolist()
    words = Vocab.load(tiny_bundle / manifest["vocab"]).encode(sentences).ids
    assert feed["ids"].shape != words.shape or (feed["ids"] != words).any()
    assert bench.graph_feed(bundle, manifest, "sentiment", sentences)["ids"].tolist() == words.tolist()
