"""Dataset readers and their one-line errors (generated files only); torch-free."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from disan.data import readers as D

STAGED = Path(__file__).resolve().parents[3].parent / "shared" / "data"


def write(path: Path, lines: list[str], gz: bool = False) -> Path:
    text = "\n".join(lines) + "\n"
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def jl(rows: list[dict]) -> list[str]:
    return [json.dumps(r) for r in rows]


@pytest.mark.parametrize("gz", [False, True])
def test_nli_jsonl_drops_unlabelled_pairs(tmp_path: Path, gz: bool) -> None:
    path = write(tmp_path / "snli.jsonl", jl([
        {"sentence1": "A man plays.", "sentence2": "A man is playing.", "gold_label": "entailment"},
        {"sentence1": "A man plays.", "sentence2": "Nobody plays.", "gold_label": "-"},
        {"sentence1": "A dog runs .", "sentence2": "A cat sleeps .", "gold_label": "contradiction"},
    ]), gz=gz)
    task, ex = D.read_examples(path)
    assert task == "nli" and [e.label for e in ex] == ["entailment", "contradiction"]
    assert ex[0].texts == (("a", "man", "plays", "."), ("a", "man", "is", "playing", "."))
    assert ex[1].where.endswith(":3")


def test_sick_jsonl_and_official_txt_agree(tmp_path: Path) -> None:
    js = write(tmp_path / "sick.jsonl", jl([
        {"pair_id": 1, "sentence_a": "A kid runs", "sentence_b": "A child runs", "relatedness": 4.5,
         "entailment": "entailment"},
        {"pair_id": 2, "sentence_a": "A kid runs", "sentence_b": "A dog sleeps", "relatedness": 1.2,
         "entailment": "neutral"}]))
    txt = write(tmp_path / "SICK.txt", [
        "pair_ID\tsentence_A\tsentence_B\tentailment_label\trelatedness_score\tSemEval_set",
        "1\tA kid runs\tA child runs\tENTAILMENT\t4.5\tTRAIN",
        "2\tA kid runs\tA dog sleeps\tNEUTRAL\t1.2\tTRAIN"])
    a, b = D.read_examples(js)[1], D.read_examples(txt)[1]
    assert [(e.texts, e.label) for e in a] == [(e.texts, e.label) for e in b]
    assert D.detect_format(txt) == "sick-txt" and D.detect_format(js) == "sick-jsonl"


TREES = ["(3 (2 (2 The) (2 Rock)) (4 (3 (2 is) (4 great)) (2 .)))",
         "(1 (2 The) (1 (1 plot) (2 (2 8 1\\/2) (0 stinks))))"]


def test_sst_trees_sentence_and_phrase_level(tmp_path: Path) -> None:
    path = write(tmp_path / "train.txt", TREES)
    task, roots = D.read_examples(path)
    assert task == "sentiment" and [e.label for e in roots] == ["3", "1"]
    assert roots[0].texts == (("the", "rock", "is", "great", "."),)
    _, phrases = D.read_examples(path, phrases=True)
    texts = [" ".join(e.texts[0]) for e in phrases]
    # every node once (the repeated leaf "The" only once), root first, leaves with spaces kept whole
    assert texts[0] == "the rock is great ." and texts.count("the") == 1
    assert "8 1/2 stinks" in texts and len(phrases) == 15
    assert dict(zip(texts, [e.label for e in phrases], strict=True))["stinks"] == "0"


def test_text_jsonl_labels_are_sorted_numerically(tmp_path: Path) -> None:
    rows = [{"text": f"movie number {i}", "label": lab} for i, lab in enumerate([10, 2, 2, 0])]
    task, ex = D.read_examples(write(tmp_path / "t.jsonl", jl(rows)))
    assert task == "sentiment" and D.label_set(task, ex) == ["0", "2", "10"]
    ds = D.make_dataset(task, ex, D.label_set(task, ex))
    assert ds.label_ids == [2, 1, 1, 0]


@pytest.mark.parametrize(("lines", "pattern"), [
    (["{\"text\": \"ok\", \"label\": 1}", "{\"text\": \"broken\""], r"bad\.jsonl:2: malformed JSON"),
    (["{\"text\": \"ok\", \"label\": 1}", "{\"label\": 1}"], r"bad\.jsonl:2: missing field 'text'"),
    (["{\"sentence1\": \"a\", \"sentence2\": \"b\", \"gold_label\": \"maybe\"}"],
     r"bad\.jsonl:1: unknown NLI label 'maybe'"),
    (["{\"text\": \"ok\", \"label\": 1}", "{\"text\": \"...\", \"label\": [1]}"],
     r"bad\.jsonl:2: label must"),
    (["(3 (2 The) (4 great)", ], r"bad\.jsonl:1: malformed tree"),
    (["(7 (2 The) (4 great))"], r"bad\.jsonl:1: unknown SST label '7'"),
    (["hello world"], r"bad\.jsonl:1: unrecognised format"),
    (["{\"foo\": 1}"], r"bad\.jsonl:1: unrecognised JSON fields"),
])
def test_bad_files_give_one_line_errors_naming_file_and_line(tmp_path: Path, lines, pattern) -> None:
    path = write(tmp_path / "bad.jsonl", lines)
    with pytest.raises(ValueError, match=pattern) as err:
        D.read_examples(path)
    assert "\n" not in str(err.value)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nope\.jsonl: no such file"):
        D.read_examples(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match=r"empty\.jsonl: file is empty"):
        D.read_examples(tmp_path / "empty.jsonl")


def test_unknown_label_in_dev_names_file_and_line(tmp_path: Path) -> None:
    train = D.read_examples(write(tmp_path / "tr.jsonl", jl([{"text": "a", "label": 0},
                                                             {"text": "b", "label": 1}])))[1]
    dev = D.read_examples(write(tmp_path / "dev.jsonl", jl([{"text": "a", "label": 0},
                                                            {"text": "c", "label": 4}])))[1]
    with pytest.raises(ValueError, match=r"dev\.jsonl:2: unknown label '4'"):
        D.make_dataset("sentiment", dev, D.label_set("sentiment", train))


def test_holdout_split_is_deterministic_and_keeps_premises_together() -> None:
    ex = [D.Example(((f"p{i // 3}",), (f"h{i}",)), "neutral", f"x:{i}") for i in range(300)]
    rest, held = D.holdout_split(ex, 30, seed=5)
    assert len(held) == 30 and len(rest) == 270
    assert {e.texts[0] for e in held}.isdisjoint({e.texts[0] for e in rest})
    assert D.holdout_split(ex, 30, seed=5)[1] == held and D.holdout_split(ex, 30, seed=6)[1] != held


@pytest.mark.skipif(not (STAGED / "sst" / "trees" / "test.txt.gz").is_file(), reason="staged data absent")
def test_tree_reader_matches_the_staged_sst_jsonl() -> None:
    trees = D.read_examples(STAGED / "sst" / "trees" / "test.txt.gz")[1]
    rows = D.read_examples(STAGED / "sst" / "sst5_test.jsonl.gz")[1]
    assert len(trees) == 2210
    assert [(e.texts, e.label) for e in trees] == [(e.texts, e.label) for e in rows]
