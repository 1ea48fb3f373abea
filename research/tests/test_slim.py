"""disan slim: a checkpoint without training state, in fp16, that every reader still takes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from disan.distill.loop import checkpoint_encoder  # noqa: E402
from disan.model import DiSANConfig, DiSANEncoder  # noqa: E402
from disan.text.tokenizer import Vocab  # noqa: E402
from disan.train.checkpoint import checkpoint_vocab, load_checkpoint, save_checkpoint  # noqa: E402
from research.cli import main  # noqa: E402
from research.slim import slim_checkpoint  # noqa: E402

WORDS = "the cat dog sat ran on a mat rug".split()
TEXTS = ["the cat sat on a mat", "a dog ran", "the rug"]


@pytest.fixture
def trained(tmp_path: Path) -> Path:
    """A `last.pt`-like encoder checkpoint: weights plus the state only a resume reads (`disan
    pretrain`'s student and optimizer, `disan train`'s trainer, RNG and weight average)."""
    torch.manual_seed(0)
    encoder = DiSANEncoder(DiSANConfig(vocab_size=len(WORDS) + 2, embed_dim=16, d_h=8, task="encoder",
                                       proj_dim=12))
    optimizer = torch.optim.Adam(encoder.parameters())
    encoder(torch.tensor([[2, 3, 4]]), torch.tensor([[True, True, True]])).sum().backward()
    optimizer.step()
    path = tmp_path / "last.pt"
    save_checkpoint(path, encoder, Vocab(WORDS), [], step=7, metrics={"stsb": 0.5},
                    optimizer_state=optimizer.state_dict(), student_state=encoder.state_dict(),
                    trainer_state={"step": 7}, rng_state=torch.get_rng_state(),
                    ema_state=encoder.state_dict())
    return path


def test_drops_training_state_and_stores_fp16(trained: Path, tmp_path: Path) -> None:
    sizes = slim_checkpoint(trained, tmp_path / "slim.pt")
    slim = load_checkpoint(tmp_path / "slim.pt")
    resume_only = {"optimizer_state", "student_state", "trainer_state", "rng_state", "ema_state"}
    assert not resume_only & set(slim)
    assert {v.dtype for v in slim["model_state"].values() if v.is_floating_point()} == {torch.float16}
    assert slim["step"] == 7 and slim["metrics"] == {"stsb": 0.5}
    assert slim["slimmed_from"] == {"file": "last.pt", "dtype": "fp16"}
    assert sizes["bytes_out"] < sizes["bytes_in"] / 3  # no optimizer moments, no second copy, half the bytes


def test_keeps_how_the_vocabulary_reads_and_where_the_weights_came_from(tmp_path: Path) -> None:
    """The 2026-11-27 lease: the slim copy of a student with hashed unknown rows lost them, so the
    phase on the GPU read every unknown word as UNK."""
    torch.manual_seed(0)
    encoder = DiSANEncoder(DiSANConfig(vocab_size=len(WORDS) + 2, embed_dim=16, d_h=8, task="encoder"))
    origin = {"file": "embed.pt", "sha256": "0" * 64}
    save_checkpoint(tmp_path / "best.pt", encoder, Vocab(WORDS, unknown_rows=3), [], init_from=origin,
                    recovered_from={"bundle": "default"})
    slim_checkpoint(tmp_path / "best.pt", tmp_path / "slim.pt")
    slim = load_checkpoint(tmp_path / "slim.pt")
    assert checkpoint_vocab(slim) == Vocab(WORDS, unknown_rows=3)
    assert slim["init_from"] == origin and slim["recovered_from"] == {"bundle": "default"}
    texts = ["the zebra sat", "a zebra ran"]  # an unknown word reads as its hashed row, not UNK
    slim_out = checkpoint_encoder(tmp_path / "slim.pt")(texts)
    assert np.allclose(slim_out, checkpoint_encoder(tmp_path / "best.pt")(texts), atol=1e-2)


def test_encodes_as_the_original_within_fp16(trained: Path, tmp_path: Path) -> None:
    slim_checkpoint(trained, tmp_path / "slim.pt")
    before = checkpoint_encoder(trained)(TEXTS)
    after = checkpoint_encoder(tmp_path / "slim.pt")(TEXTS)  # loaded into an fp32 model
    assert after.dtype == before.dtype
    cos = (before * after).sum(1) / (np.linalg.norm(before, axis=1) * np.linalg.norm(after, axis=1))
    assert cos.min() > 0.999
    assert not (before == after).all()  # the weights really were rounded


def test_cli_writes_and_refuses_to_overwrite_its_source(trained: Path, tmp_path: Path, capsys) -> None:
    assert main(["slim", str(trained), str(tmp_path / "out" / "slim.pt"), "--dtype", "bf16"]) == 0
    assert "MB (from" in capsys.readouterr().out
    slim = load_checkpoint(tmp_path / "out" / "slim.pt")
    assert slim["model_state"]["embed.weight"].dtype == torch.bfloat16
    assert main(["slim", str(trained), str(trained)]) == 2
    assert "is the checkpoint itself" in capsys.readouterr().err
    assert main(["slim", str(tmp_path / "missing.pt"), str(tmp_path / "x.pt")]) == 2
    assert "checkpoint not found" in capsys.readouterr().err


def test_halves_a_teacher_folder_and_copies_the_rest(tmp_path: Path, capsys) -> None:
    pytest.importorskip("safetensors", reason="safetensors comes with the minilm extra "
                        "(sentence-transformers): pip install '.[minilm]'")
    from safetensors.torch import load_file, save_file

    src = tmp_path / "teacher"
    (src / "1_Pooling").mkdir(parents=True)
    (src / "1_Pooling" / "config.json").write_text("{}")
    (src / "modules.json").write_text("[]")
    save_file({"w": torch.randn(4, 3), "ids": torch.arange(3)}, src / "model.safetensors")
    assert main(["slim", str(src), str(tmp_path / "half")]) == 0
    half = load_file(tmp_path / "half" / "model.safetensors")
    assert half["w"].dtype == torch.float16 and half["ids"].dtype == torch.int64
    assert torch.allclose(half["w"].float(), load_file(src / "model.safetensors")["w"], atol=1e-3)
    assert (tmp_path / "half" / "1_Pooling" / "config.json").is_file()
    assert (tmp_path / "half" / "modules.json").is_file()
    assert main(["slim", str(src), str(tmp_path / "half")]) == 2  # never over an existing folder
    assert "exists" in capsys.readouterr().err
    assert main(["slim", str(tmp_path / "half" / "1_Pooling"), str(tmp_path / "x")]) == 2
    assert "no model.safetensors" in capsys.readouterr().err


@pytest.fixture
def borrowing(tmp_path: Path) -> Path:
    """A start that reads words through a borrowed table (as `disan distill whole-words` writes),
    in fp32, as `model_export.recover` gives it."""
    torch.manual_seed(1)
    cfg = DiSANConfig(vocab_size=len(WORDS) + 2, embed_dim=16, d_h=8, task="encoder", proj_dim=12,
                      borrowed_rows=400, borrowed_dim=10, borrowed_offset=len(WORDS) + 2)
    encoder = DiSANEncoder(cfg)
    encoder.borrowed.copy_(torch.randn(400, 10))
    save_checkpoint(tmp_path / "start.pt", encoder, Vocab(WORDS), [])
    return tmp_path / "start.pt"


def test_a_borrowed_table_stays_behind_and_comes_back_from_the_start(borrowing: Path, tmp_path: Path) -> None:
    """The lease kit's student from the shipped encoder: the 187,234-row word table it borrows is
    112 MB in fp16 and never trains, so it stays on the device and is put back here."""
    trained = tmp_path / "student.pt"
    payload = load_checkpoint(borrowing)
    payload["model_state"]["proj.weight"] = payload["model_state"]["proj.weight"] + 0.5  # "trained"
    torch.save(payload, trained)
    slim_checkpoint(trained, tmp_path / "back.pt", without_borrowed=True)
    back = load_checkpoint(tmp_path / "back.pt")
    assert "borrowed" not in back["model_state"]
    assert back["borrowed_left_out"]["shape"] == [400, 10]
    slim_checkpoint(trained, tmp_path / "with.pt")
    saved = (tmp_path / "with.pt").stat().st_size - (tmp_path / "back.pt").stat().st_size
    assert saved >= 400 * 10 * 2  # the table's fp16 bytes

    assert main(["slim", str(tmp_path / "back.pt"), str(tmp_path / "whole.pt"), "--borrowed-from",
                 str(borrowing), "--dtype", "fp32"]) == 0
    whole = load_checkpoint(tmp_path / "whole.pt")
    assert "borrowed_left_out" not in whole
    start = load_checkpoint(borrowing)["model_state"]
    assert torch.equal(whole["model_state"]["borrowed"], start["borrowed"])
    assert torch.allclose(whole["model_state"]["proj.weight"], payload["model_state"]["proj.weight"],
                          atol=1e-2)  # the trained head, through fp16
    assert np.allclose(checkpoint_encoder(tmp_path / "whole.pt")(TEXTS), checkpoint_encoder(trained)(TEXTS),
                       atol=1e-2)


def test_only_the_table_the_student_trained_with_goes_back(borrowing: Path, tmp_path: Path, trained: Path,
                                                            capsys) -> None:
    slim_checkpoint(borrowing, tmp_path / "back.pt", without_borrowed=True)
    other = load_checkpoint(borrowing)
    other["model_state"]["borrowed"][3, 2] += 1.0
    torch.save(other, tmp_path / "other.pt")
    assert main(["slim", str(tmp_path / "back.pt"), str(tmp_path / "x.pt"), "--borrowed-from",
                 str(tmp_path / "other.pt")]) == 2
    assert "is not the one the student trained with" in capsys.readouterr().err
    assert main(["slim", str(trained), str(tmp_path / "y.pt"), "--borrowed-from", str(borrowing)]) == 2
    assert "left no borrowed table out" in capsys.readouterr().err
    assert main(["slim", str(tmp_path / "back.pt"), str(tmp_path / "z.pt"), "--borrowed-from",
                 str(trained)]) == 2
    assert "reads no borrowed word table" in capsys.readouterr().err
    slim_checkpoint(trained, tmp_path / "plain.pt", without_borrowed=True)  # nothing to leave out
    assert "borrowed_left_out" not in load_checkpoint(tmp_path / "plain.pt")


def test_a_teacher_folder_refuses_the_borrowed_table_flags(tmp_path: Path, capsys) -> None:
    (tmp_path / "teacher").mkdir()
    for flags in (["--without-borrowed"], ["--borrowed-from", str(tmp_path / "start.pt")]):
        assert main(["slim", str(tmp_path / "teacher"), str(tmp_path / "half"), *flags]) == 2
        assert "a teacher folder has no borrowed word table" in capsys.readouterr().err
    assert not (tmp_path / "half").exists()
