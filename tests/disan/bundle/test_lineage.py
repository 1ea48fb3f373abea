"""disan.bundle.lineage: a manifest's sources stored flat, each checkpoint once, and read back nested."""

from __future__ import annotations

import copy

import pytest

from disan.bundle.lineage import flat, nested


def entry(name: str, sha: str, **records) -> dict:
    return {"file": name, "sha256": sha * 64, **records}


def depth(value, d: int = 0) -> int:
    if isinstance(value, dict):
        return max([depth(v, d + 1) for v in value.values()] + [d])
    if isinstance(value, list):
        return max([depth(v, d + 1) for v in value] + [d])
    return d


def chain(steps: int) -> dict:
    """A checkpoint trained for `steps` phases, each from the last (`disan pretrain --init-from`),
    from one recovered from a bundle: one nesting level per phase."""
    node = entry("embed.pt", "0", recovered_from={"bundle": "b", "graphs": {"encoder.onnx": "9" * 64},
                                                   "original_checkpoint": entry("best.pt", "f")})
    for i in range(1, steps + 1):
        node = entry("last.pt", "0123456789abcdef"[i % 16] + str(i), init_from=node)
    return node


def test_flat_sources_nest_back_exactly_with_depth_bounded() -> None:
    start = chain(6)
    phases = [entry("last.pt", s, init_from=copy.deepcopy(start)) for s in "abc"]
    merged = entry("merged.pt", "d", merge={"start": copy.deepcopy(start), "phase": phases, "scale": 1.0})
    sources = {"embed": merged, "nli": entry("nli.pt", "e", borrowing={"lender": copy.deepcopy(start)})}
    before = copy.deepcopy(sources)

    top, lineage = flat(sources)

    assert sources == before  # the input is not changed
    assert {name: nested(e, lineage) for name, e in top.items()} == sources
    assert depth(sources) > 12 and depth(top) <= 5 and depth(lineage) <= 5
    # the start, named by the merge, by each of its three phases and by the NLI model, is stored once
    assert sum(e["sha256"] == start["sha256"] for e in lineage.values()) == 1
    assert top["embed"]["merge"]["start"] == {"file": "last.pt", "sha256": start["sha256"]}
    assert top["nli"]["borrowing"]["lender"] == top["embed"]["merge"]["start"]
    # a file without records of its own (a graph, the first checkpoint) is its own reference
    assert "f" * 64 not in lineage


def test_a_reference_keeps_its_own_file_name() -> None:
    shared = entry("embed.pt", "a", init_from=entry("s.pt", "b", init_from=entry("t.pt", "c")))
    renamed = {**copy.deepcopy(shared), "file": "embed-copy.pt"}
    sources = {"nli": entry("n.pt", "1", borrowing={"lender": shared}),
               "sentiment": entry("s.pt", "2", borrowing={"lender": renamed})}
    top, lineage = flat(sources)
    assert {name: nested(e, lineage) for name, e in top.items()} == sources
    assert top["sentiment"]["borrowing"]["lender"] == {"file": "embed-copy.pt", "sha256": "a" * 64}


def test_one_sha256_with_two_histories_stays_nested() -> None:
    # A file's own provenance cannot differ between two mentions; a hand-edited one can, and
    # flattening must still give back exactly what it was given.
    one, other = entry("x.pt", "a", init_from=entry("s.pt", "b", note="1")), entry("x.pt", "a", note="2")
    sources = {"nli": entry("n.pt", "1", init_from=one), "sentiment": entry("s.pt", "2", init_from=other)}
    top, lineage = flat(sources)
    assert {name: nested(e, lineage) for name, e in top.items()} == sources
    assert top["sentiment"]["init_from"]["note"] == "2"


def test_a_file_named_with_and_without_its_history_stays_nested() -> None:
    # Only a hand-edited provenance can name one file both ways; its reference-only mention
    # must not come back with the other mention's history.
    full = entry("x.pt", "a", init_from=entry("s.pt", "b", note="1"))
    sources = {"nli": entry("n.pt", "1", init_from=full),
               "sentiment": entry("s.pt", "2", init_from={"file": "x.pt", "sha256": "a" * 64})}
    top, lineage = flat(sources)
    assert (top, lineage) == (sources, {})


def test_a_manifest_without_a_lineage_reads_as_it_is() -> None:
    old = {"file": "nli.pt", "sha256": "a" * 64, "init_from": chain(3)}
    assert nested(old, {}) == old


def test_a_checkpoint_among_its_own_sources_is_refused() -> None:
    loop = {"a" * 64: entry("x.pt", "a", init_from={"file": "x.pt", "sha256": "a" * 64})}
    with pytest.raises(ValueError, match="named among its own sources"):
        nested({"file": "x.pt", "sha256": "a" * 64}, loop)
