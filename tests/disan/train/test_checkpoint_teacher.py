"""`disan task-teacher --checkpoints`: trained sentiment models as the teacher, their mean
probabilities of every training example in soft.npz, which `disan train --soft-targets` reads."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support_files import write_fake_sst5  # noqa: E402

from disan.bundle.manifest import SST5_LABELS  # noqa: E402
from disan.cli import main  # noqa: E402
from disan.data import readers as D  # noqa: E402
from disan.train.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from disan.train.loop import collate  # noqa: E402

WORDS = ["a", "man", "plays", "the", "guitar", "dog", "runs", "badly", "well"]
TINY = ["--init", "random", "--embed-dim", "8", "--glove-extra", "0", "--d-h", "8", "--epochs", "1",
        "--no-progress", "--threads", "1", "--batch-size", "8"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, list[Path]]:
    """A fake staged SST-5 and two tiny models trained on it: one naming its classes by the
    recipe's names, one by the raw labels."""
    tmp = tmp_path_factory.mktemp("ct")
    root = write_fake_sst5(tmp / "data", WORDS, sentences=24, more_phrases=30, longest=7)
    files = ["--train", str(root / "sst/sst5_phrases_train.jsonl.gz"),
             "--dev", str(root / "sst/sst5_dev.jsonl.gz")]
    models = []
    for seed, names in ((1, ["--label-names", ",".join(SST5_LABELS)]), (2, [])):
        out = tmp / f"m{seed}"
        assert main(["train", "--task", "sentiment", *files, *TINY, *names, "--seed", str(seed),
                     "--out", str(out)]) == 0
        models.append(out / "best.pt")
    return root, models


def _probabilities(path: Path, tokens: tuple[str, ...]) -> np.ndarray:
    """One model's probabilities of one example, columns in raw-label order 0..4."""
    model, vocab, labels = model_from_checkpoint(load_checkpoint(path))
    raw = [str(c) for c in range(5)]
    names = raw if sorted(labels) == raw else list(SST5_LABELS)
    ex = D.Example(texts=(tokens,), label="0", where="-")
    data = D.encode_dataset(D.make_dataset("sentiment", [ex], raw), vocab, None)
    inputs, _ = collate(data, [0])
    with torch.no_grad():
        p = torch.softmax(model(*inputs).double(), -1)[0].numpy()
    return p[[labels.index(n) for n in names]]


def test_the_soft_labels_are_the_mean_of_the_models_and_train_reads_them(trained, tmp_path: Path) -> None:
    root, models = trained
    out = tmp_path / "tt"
    assert main(["distill", "task-teacher", "--data", str(root), "--checkpoints", *map(str, models),
                 "--threads", "1", "--out", str(out)]) == 0
    with np.load(out / "soft.npz") as z:
        keys, logits, columns = list(z["keys"]), z["logits"], list(z["labels"])
    phrases = [" ".join(json.loads(line)["text"].split())
               for line in gzip.open(root / "sst/sst5_phrases_train.jsonl.gz", "rt")]
    assert keys == list(dict.fromkeys(phrases)) and columns == ["0", "1", "2", "3", "4"]
    for i in (0, 7, len(keys) - 1):  # batches are sorted by length: rows must come back in order
        tokens = tuple(keys[i].split(" "))
        mean = np.mean([_probabilities(m, tokens) for m in models], axis=0)
        assert np.exp(logits[i]) == pytest.approx(mean, abs=1e-5)
    assert json.loads((out / "checkpoint_teacher.json").read_text())["examples"] == len(keys)
    rc = main(["train", "--task", "sentiment", "--train", str(root / "sst/sst5_phrases_train.jsonl.gz"),
               "--dev", str(root / "sst/sst5_dev.jsonl.gz"), *TINY, "--soft-targets", str(out / "soft.npz"),
               "--kd-weight", "1", "--out", str(tmp_path / "kd")])
    assert rc == 0


@pytest.mark.parametrize("case", ["missing", "nli", "augment", "unlabelled"])
def test_bad_input_is_a_one_line_error(trained, tmp_path: Path, capsys, case: str) -> None:
    root, models = trained
    ckpt, extra, message = str(models[0]), [], ""
    if case == "missing":
        ckpt, message = str(tmp_path / "nope.pt"), "no such checkpoint"
    elif case == "nli":
        payload = load_checkpoint(models[0])
        payload["config"]["task"] = "nli"
        torch.save(payload, tmp_path / "nli.pt")
        ckpt, message = str(tmp_path / "nli.pt"), "not a sentiment checkpoint"
    elif case == "augment":
        extra, message = ["--augment", "2"], "--augment"
    else:  # a corpus folder, which --checkpoints would otherwise leave unlabelled without a word
        (tmp_path / "corpus").mkdir()
        (tmp_path / "corpus" / "corpus.json").write_text("{}")
        extra, message = ["--unlabelled", str(tmp_path / "corpus")], "--unlabelled"
    capsys.readouterr()
    rc = main(["distill", "task-teacher", "--data", str(root), "--checkpoints", ckpt, *extra,
               "--out", str(tmp_path / "tt")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and message in err
    assert not (tmp_path / "tt" / "soft.npz").exists()
