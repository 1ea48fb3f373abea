"""`disan calibrate` (model_export/calibrate.py): class offsets chosen on the recipe's dev set as the
bundle serves the model, added to the head's last bias, and carried into the next bundle."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import WORDS, make_tiny_checkpoint

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from disan import Encoder  # noqa: E402
from disan.bundle.manifest import load_manifest  # noqa: E402
from disan.cli import main  # noqa: E402
from disan.train.checkpoint import load_checkpoint  # noqa: E402
from model_export import calibrate as cal  # noqa: E402
from model_export.export import ExportConfig, build_bundle  # noqa: E402


def test_the_offsets_are_the_smallest_that_reach_the_best_accuracy() -> None:
    logits = np.array([[0.3, 0.0, -1.0]] * 4 + [[1.0, 0.0, -1.0]])
    labels = np.array([1, 1, 1, 1, 0])  # neutral needs more than 0.3; the fifth row stays entailment
    np.testing.assert_allclose(cal.choose_offsets(logits, labels, 0.05, 1.0), [0.0, 0.35, 0.0])
    right = np.array([0, 0, 0, 0, 0])
    np.testing.assert_allclose(cal.choose_offsets(logits, right, 0.05, 1.0), [0.0, 0.0, 0.0])  # no gain: none


HELD_OUT = 20  # the recipe holds out 1,500 SNLI dev pairs; this file has 40


@pytest.fixture()
def staged(tmp_path: Path, monkeypatch) -> Path:
    """A staged SNLI dev file whose gold label is always neutral: the offset that calls every pair
    neutral is the best one, whatever the random model says."""
    monkeypatch.setattr(cal, "HOLDOUT_SIZE", HELD_OUT)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(40):
        premise = " ".join(rng.choice(WORDS[:60], size=5))
        rows.append({"sentence1": premise, "sentence2": " ".join(rng.choice(WORDS[:60], size=4)),
                     "gold_label": "neutral", "pairID": str(i)})
    path = tmp_path / "data" / "snli" / "dev.jsonl.gz"
    path.parent.mkdir(parents=True)
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    return tmp_path / "data"


def test_the_calibrated_model_serves_its_offsets_and_the_bundle_names_them(staged, tiny_bundle,
                                                                          tiny_checkpoints, tmp_path, capsys):
    out = tmp_path / "nli-cal.pt"
    assert main(["calibrate", str(tiny_checkpoints.nli), "--bundle", str(tiny_bundle), "--data", str(staged),
                 "--out", str(out), "--limit", "3", "--step", "0.1"]) == 0
    assert "offsets {'entailment': 0.0, 'neutral':" in capsys.readouterr().out
    record = load_checkpoint(out)["calibration"]
    assert record["dev_n"] == HELD_OUT and record["dev_acc_after"] == 1.0 > record["dev_acc_before"]
    assert record["from"]["file"] == "nli.pt" and record["labels"] == tiny_checkpoints.nli_labels

    # the head's bias moved by the offsets, and nothing else changed
    before, after = load_checkpoint(tiny_checkpoints.nli)["model_state"], load_checkpoint(out)["model_state"]
    for name, tensor in before.items():
        want = tensor + torch.tensor(record["offsets"], dtype=tensor.dtype) if name == cal.BIAS else tensor
        torch.testing.assert_close(after[name], want, rtol=0, atol=1e-7, msg=name)

    # exported, the bundle serves it (every held-out pair neutral) and names the calibration in its sources
    bundle = tmp_path / "bundle"
    build_bundle(ExportConfig(out, tiny_checkpoints.sentiment, bundle, sets=("cpu",),
                              fp16=False), log=lambda *_: None)
    assert load_manifest(bundle)["sources"]["nli"]["calibration"]["offsets"] == record["offsets"]
    _, examples, _ = cal.dev_set("nli", 3, staged)
    served = Encoder(bundle, providers="cpu").nli([tuple(" ".join(t) for t in ex.texts) for ex in examples])
    assert {r["label"] for r in served} == {"neutral"}


@pytest.mark.parametrize("flags, message", [
    (["--step", "0"], "--step 0.0 --limit 1.0: give a step above 0"),
    (["--step", "0.001"], "at most 201 grid points"),
])
def test_bad_input_is_a_one_line_error(staged, tiny_bundle, tiny_checkpoints, tmp_path, capsys, flags,
                                       message) -> None:
    rc = main(["calibrate", str(tiny_checkpoints.nli), "--bundle", str(tiny_bundle), "--data", str(staged),
               "--out", str(tmp_path / "x.pt"), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and message in err[-1] and len(err) == 1, err
    assert not (tmp_path / "x.pt").exists()


def test_what_it_cannot_calibrate_is_named(staged, tiny_bundle, tiny_checkpoints, tmp_path, capsys) -> None:
    def err_of(checkpoint: Path, out: Path) -> str:
        assert main(["calibrate", str(checkpoint), "--bundle", str(tiny_bundle), "--data", str(staged),
                     "--out", str(out)]) == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    assert "5 classes; calibrate takes at most 3" in err_of(tiny_checkpoints.sentiment, tmp_path / "s.pt")
    three = make_tiny_checkpoint(tmp_path / "3.pt", "sentiment", tiny_checkpoints.vocab, list("abc"), seed=3)
    assert "no recipe has a 3-class sentiment dev set" in err_of(three, tmp_path / "t.pt")
    assert "give a new file" in err_of(tiny_checkpoints.nli, tiny_checkpoints.nli)
    once = tmp_path / "once.pt"
    assert main(["calibrate", str(tiny_checkpoints.nli), "--bundle", str(tiny_bundle), "--data", str(staged),
                 "--out", str(once)]) == 0
    assert "already calibrated" in err_of(once, tmp_path / "twice.pt")
