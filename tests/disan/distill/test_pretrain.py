"""Encoder pre-training by distillation (`disan pretrain`) and `disan train --init-encoder`."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from disan.cli import main  # noqa: E402
from disan.distill.config import PretrainConfig  # noqa: E402
from disan.distill.pretrain import pretrain_encoder  # noqa: E402
from disan.distill.pretrain_cli import collect_sentences  # noqa: E402
from disan.train.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402

WORDS = "a man dog cat runs sleeps the park in on red big small".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("distill")
    rng = random.Random(0)
    rows = []
    for i in range(60):
        p = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7)))
        h = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5)))
        label = ["entailment", "neutral", "contradiction"][i % 3]
        rows.append({"sentence1": p, "sentence2": h, "gold_label": label})
    (root / "nli.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "glove.txt").write_text("".join(
        w + " " + " ".join(f"{rng.uniform(-1, 1):.3f}" for _ in range(8)) + "\n" for w in WORDS))
    return {"nli": root / "nli.jsonl", "glove": root / "glove.txt", "root": root}


def _args(out: Path, glove: Path, **kw) -> PretrainConfig:
    base = dict(out=out, init="glove", glove=glove, glove_extra=0, vocab=None, embed_dim=8, d_h=8, threads=1,
                lr=3e-3, seed=1, epochs=25, batch_size=16, max_minutes=None, texts=(), exclude=())
    return PretrainConfig(**{**base, **kw})


def test_collect_sentences_drops_the_held_out_slice(corpus) -> None:
    everything = collect_sentences([corpus["nli"]])
    kept = collect_sentences([corpus["nli"]], holdout=(corpus["nli"], 10, 3))
    assert 0 < len(kept) < len(everything) and set(kept) < set(everything)


def test_student_learns_the_teacher_and_checkpoint_loads(corpus, tmp_path: Path) -> None:
    sentences = collect_sentences([corpus["nli"]])
    # A learnable teacher: a fixed random projection of bag-of-words counts, normalised.
    proj = np.random.default_rng(0).normal(size=(len(WORDS), 16))
    bows = np.array([[s.split().count(w) for w in WORDS] for s in sentences], dtype=np.float64)
    teacher = bows @ proj
    teacher = (teacher / np.linalg.norm(teacher, axis=1, keepdims=True)).astype(np.float16)
    best = pretrain_encoder(_args(tmp_path, corpus["glove"]), sentences, teacher)
    first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert best["val_cosine"] > max(0.5, first["val_cosine"])
    model, vocab, labels = model_from_checkpoint(load_checkpoint(tmp_path / "best.pt"))
    assert model.cfg.task == "encoder" and labels == [] and len(vocab) == len(WORDS) + 2


def _pretrained(corpus, out: Path) -> Path:
    """A one-epoch `disan pretrain` run on random teacher vectors: its folder."""
    sentences = collect_sentences([corpus["nli"]])
    teacher = np.random.default_rng(1).normal(size=(len(sentences), 16)).astype(np.float16)
    pretrain_encoder(_args(out, corpus["glove"], epochs=1), sentences, teacher)
    return out


def _train_nli(corpus) -> list[str]:
    """`disan train` on the toy NLI data with lr 0 (Adadelta): no weight moves."""
    return ["train", "--task", "nli", "--train", str(corpus["nli"]), "--dev", str(corpus["nli"]),
            "--glove", str(corpus["glove"]), "--d-h", "8", "--no-progress", "--threads", "1",
            "--epochs", "1", "--eval-every", "0", "--lr", "0"]


def test_init_encoder_copies_weights_and_checks_vocab(corpus, tmp_path: Path) -> None:
    pre = _pretrained(corpus, tmp_path / "pre")
    out = tmp_path / "nli"
    common = _train_nli(corpus)
    assert main([*common, "--vocab", str(pre / "vocab.json"), "--init-encoder", str(pre / "best.pt"),
                 "--out", str(out)]) == 0
    enc = load_checkpoint(pre / "best.pt")["model_state"]
    nli = load_checkpoint(out / "last.pt")["model_state"]
    # lr 0 (Adadelta): no weight moves, so the NLI encoder must equal the pre-trained one.
    for key, value in enc.items():
        if key != "trainable_rows":
            assert torch.equal(nli[f"encoder.{key}"], value), key
    # Another shape refuses with one line.
    assert main([*common, "--d-h", "6", "--vocab", str(pre / "vocab.json"), "--init-encoder",
                 str(pre / "best.pt"), "--out", str(tmp_path / "bad")]) == 2


def test_init_encoder_matches_word_vectors_by_word(corpus, tmp_path: Path) -> None:
    """With another vocabulary (the bundle's shared one, say) each word the checkpoint knows takes
    its row; the rest keep this run's initial vectors."""
    pre = _pretrained(corpus, tmp_path / "pre")
    own = load_checkpoint(pre / "best.pt")
    plain = tmp_path / "plain"
    assert main([*_train_nli(corpus), "--glove-extra", "2", "--out", str(plain)]) == 0
    words = load_checkpoint(plain / "last.pt")["vocab"]
    assert words != own["vocab"] and set(own["vocab"]) & set(words[2:])
    out = tmp_path / "nli"
    assert main([*_train_nli(corpus), "--glove-extra", "2", "--init-encoder", str(pre / "best.pt"),
                 "--out", str(out)]) == 0
    task = load_checkpoint(out / "last.pt")
    assert task["vocab"] == words
    table, start = task["model_state"]["encoder.embed.weight"], load_checkpoint(plain / "last.pt")
    own_row = {w: own["model_state"]["embed.weight"][i] for i, w in enumerate(own["vocab"])}
    for i, word in enumerate(words):
        expected = own_row[word] if word in own_row else start["model_state"]["encoder.embed.weight"][i]
        assert torch.equal(table[i], expected), word
    for key, value in own["model_state"].items():
        if key not in ("trainable_rows", "embed.weight"):
            assert torch.equal(task["model_state"][f"encoder.{key}"], value), key


def test_init_encoder_from_a_student_with_a_served_projection(corpus, tmp_path: Path) -> None:
    """A `pretrain --corpus --serve-proj` student ends in a map into its teacher's space; a task
    model starts from the rest of its encoder (the head reads DiSAN's own 2*d_h vector)."""
    pre = _pretrained(corpus, tmp_path / "pre")
    student = load_checkpoint(pre / "best.pt")
    student["config"]["proj_dim"] = 12  # what DiSANConfig.proj_dim holds for a served projection
    student["model_state"]["proj.weight"] = torch.randn(12, 16)
    student["model_state"]["proj.bias"] = torch.zeros(12)
    torch.save(student, pre / "student.pt")
    model_from_checkpoint(load_checkpoint(pre / "student.pt"))  # a well-formed student checkpoint
    out = tmp_path / "task"
    assert main([*_train_nli(corpus), "--vocab", str(pre / "vocab.json"),
                 "--init-encoder", str(pre / "student.pt"), "--out", str(out)]) == 0
    task = load_checkpoint(out / "last.pt")
    assert not task["config"].get("proj_dim")
    assert not any(k.startswith("encoder.proj.") for k in task["model_state"])
    for key, value in student["model_state"].items():
        if key != "trainable_rows" and not key.startswith("proj."):
            assert torch.equal(task["model_state"][f"encoder.{key}"], value), key
