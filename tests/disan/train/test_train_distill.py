"""Training with a task teacher (`disan train --soft-targets`, `--augmented`): the distillation
loss, rows without teacher logits or without a gold label, and the CLI's teacher files."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)  # tiny tensors: threads only add overhead on a shared CPU

from test_train import TINY, run_cli, sentence, tiny_model, write_files  # noqa: E402

from disan.data.readers import EncodedDataset  # noqa: E402
from disan.train.checkpoint import load_checkpoint  # noqa: E402
from disan.train.loop import collate, train_step  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    return write_files(tmp_path_factory.mktemp("data"))


def test_distillation_loss_is_zero_at_the_teacher_and_scaled_by_t_squared() -> None:
    from disan.train.loop import distillation_loss

    teacher = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    assert distillation_loss(teacher.clone(), teacher, 2.0).abs() < 1e-6
    student = torch.zeros(2, 3)
    p = torch.softmax(teacher / 3.0, -1)
    kl = (p * (p.log() - torch.log_softmax(student / 3.0, -1))).sum()
    assert torch.allclose(distillation_loss(student, teacher, 3.0), 9.0 * kl)


def test_soft_targets_teach_what_the_teacher_says_not_the_gold_label() -> None:
    """With --kd-weight 1 the student learns the teacher's labels; here the teacher says the
    opposite of the gold label for every example, so a trainer that ignored it would learn gold."""
    gen = np.random.default_rng(0)
    ids = [(gen.integers(2, 30, size=gen.integers(1, 9)).astype(np.int64),) for _ in range(32)]
    gold = gen.integers(0, 2, size=32)
    data = EncodedDataset("sentiment", ids, gold, soft=np.where(np.eye(3)[1 - gold] > 0, 6.0, -6.0)
                          .astype(np.float32))
    model = tiny_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(150):
        train_step(model, opt, data, np.arange(32), torch.device("cpu"), 10**6, kd_weight=1.0)
    model.eval()
    inputs, y = collate(data, np.arange(32))
    assert (model(*inputs).argmax(-1).numpy() == 1 - gold).all()


def test_rows_without_teacher_logits_learn_from_their_gold_label() -> None:
    """NaN logits are "no opinion": with --kd-weight 1 those rows still learn their gold labels,
    while the taught rows follow the teacher (here the opposite of gold)."""
    gen = np.random.default_rng(1)
    ids = [(gen.integers(2, 30, size=gen.integers(1, 9)).astype(np.int64),) for _ in range(32)]
    gold = gen.integers(0, 2, size=32)
    soft = np.where(np.eye(3)[1 - gold] > 0, 6.0, -6.0).astype(np.float32)
    soft[16:] = np.nan
    data = EncodedDataset("sentiment", ids, gold, soft=soft)
    model = tiny_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(200):
        loss, _ = train_step(model, opt, data, np.arange(32), torch.device("cpu"), 10**6, kd_weight=1.0)
        assert np.isfinite(loss)
    model.eval()
    inputs, _ = collate(data, np.arange(32))
    pred = model(*inputs).argmax(-1).numpy()
    assert (pred[:16] == 1 - gold[:16]).all() and (pred[16:] == gold[16:]).all()


def _soft_file(path: Path, texts: list[str], logits: np.ndarray, labels=("0", "1")) -> Path:
    from disan.text.tokenizer import tokenize
    from disan.train.soft_labels import example_key

    np.savez(path, keys=np.asarray([example_key(tuple(tokenize(t))) for t in texts]), logits=logits,
             labels=np.asarray(labels))
    return path


def test_cli_trains_with_soft_targets_and_refuses_a_file_that_misses_examples(files, tmp_path: Path,
                                                                             capsys) -> None:
    texts = [json.loads(r)["text"] for r in files["sent_train"].read_text().splitlines()]
    labels = [json.loads(r)["label"] for r in files["sent_train"].read_text().splitlines()]
    # the teacher's columns in another order than the training labels: mapped by name
    logits = np.asarray([[0.0, 3.0] if lab == 0 else [3.0, 0.0] for lab in labels], dtype=np.float32)
    soft = _soft_file(tmp_path / "soft.npz", texts, logits, labels=("1", "0"))
    common = ["--task", "sentiment", "--train", files["sent_train"], "--dev", files["sent_dev"],
              "--glove", files["glove"], "--epochs", "1", *TINY]
    assert run_cli(*common, "--soft-targets", soft, "--kd-weight", "0.7", "--kd-temperature", "2",
                   "--out", tmp_path / "kd") == 0
    cfg = load_checkpoint(tmp_path / "kd" / "best.pt")["train_config"]
    assert (cfg["soft_targets"], cfg["kd_weight"], cfg["kd_temperature"]) == (str(soft), 0.7, 2.0)
    capsys.readouterr()

    short = _soft_file(tmp_path / "short.npz", texts[:-1], logits[:-1])
    assert run_cli(*common, "--soft-targets", short, "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no teacher logits for 1 of 48 training examples" in err
    wrong = _soft_file(tmp_path / "wrong.npz", texts, logits, labels=("0", "2"))
    assert run_cli(*common, "--soft-targets", wrong, "--out", tmp_path / "o") == 2
    assert "are not the training labels" in capsys.readouterr().err
    assert run_cli(*common, "--soft-targets", tmp_path / "none.npz", "--out", tmp_path / "o") == 2
    assert "not a soft-target file" in capsys.readouterr().err
    assert run_cli(*common, "--soft-targets", soft, "--kd-weight", "1.5", "--out", tmp_path / "o") == 2
    assert "--kd-weight 1.5" in capsys.readouterr().err


def test_examples_without_a_gold_label_learn_from_the_teacher_alone() -> None:
    """`--augmented` rows (label id -1) follow the teacher whatever --kd-weight is (here 0: the
    gold rows learn from their labels alone), and training accuracy counts the gold rows only. A
    trainer that took -1 for a class fails: cross-entropy refuses the label."""
    gen = np.random.default_rng(2)
    ids = [(gen.integers(2, 30, size=gen.integers(3, 9)).astype(np.int64),) for _ in range(32)]
    gold = gen.integers(0, 2, size=32)
    taught = gen.integers(0, 3, size=16)  # the teacher's class of each example without a label
    soft = np.full((32, 3), np.nan, dtype=np.float32)
    soft[16:] = np.where(np.eye(3)[taught] > 0, 6.0, -6.0)
    labels = gold.copy()
    labels[16:] = -1
    data = EncodedDataset("sentiment", ids, labels, soft=soft)
    model = tiny_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(200):
        loss, correct = train_step(model, opt, data, np.arange(32), torch.device("cpu"), 10**6,
                                   kd_weight=0.0)
        assert np.isfinite(loss) and correct <= 16
    model.eval()
    inputs, _ = collate(data, np.arange(32))
    pred = model(*inputs).argmax(-1).numpy()
    assert (pred[:16] == gold[:16]).all() and (pred[16:] == taught).all()


def test_cli_adds_the_teacher_labelled_examples_and_refuses_a_bad_file(files, tmp_path: Path,
                                                                       capsys) -> None:
    rng = random.Random(5)
    texts = [sentence(rng, i % 2 == 1) + " cat" for i in range(10)]
    logits = np.asarray([[0.0, 4.0] if i % 2 else [4.0, 0.0] for i in range(10)], dtype=np.float32)
    augmented = _soft_file(tmp_path / "augmented.npz", texts, logits)
    common = ["--task", "sentiment", "--train", files["sent_train"], "--dev", files["sent_dev"],
              "--glove", files["glove"], "--epochs", "1", *TINY]
    assert run_cli(*common, "--augmented", augmented, "--out", tmp_path / "aug") == 0
    ckpt = load_checkpoint(tmp_path / "aug" / "best.pt")
    assert ckpt["train_config"]["augmented"] == str(augmented)
    assert ckpt["sizes"]["train"] == 48 + 10
    history = [json.loads(r) for r in (tmp_path / "aug" / "metrics.jsonl").read_text().splitlines()]
    assert all(0.0 <= r["train_acc"] <= 1.0 for r in history if "train_acc" in r)
    capsys.readouterr()

    wrong = _soft_file(tmp_path / "wrong.npz", texts, logits, labels=("0", "2"))
    assert run_cli(*common, "--augmented", wrong, "--out", tmp_path / "o") == 2
    assert "are not the training labels" in capsys.readouterr().err
    assert run_cli(*common, "--augmented", tmp_path / "none.npz", "--out", tmp_path / "o") == 2
    assert "not a teacher-labelled example file" in capsys.readouterr().err
    skew = tmp_path / "skew.npz"
    np.savez(skew, keys=np.asarray(["a cat"]), logits=np.zeros((2, 2), np.float32),
             labels=np.asarray(["0", "1"]))
    assert run_cli(*common, "--augmented", skew, "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "logits of shape (2, 2) for 1 keys" in err
    nli = ["--task", "nli", "--train", files["nli_train"], "--dev", files["nli_dev"],
           "--glove", files["glove"], "--epochs", "1", *TINY]
    assert run_cli(*nli, "--augmented", augmented, "--out", tmp_path / "o") == 2
    assert "only sentiment tasks" in capsys.readouterr().err
