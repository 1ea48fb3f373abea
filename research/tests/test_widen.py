"""disan widen: a wider DiSAN encoder that serves the vectors of the one it grew from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import make_tiny_checkpoint  # noqa: E402

from disan.distill.loop import checkpoint_encoder  # noqa: E402
from disan.model import DiSANConfig, DiSANEncoder  # noqa: E402
from disan.text.tokenizer import Vocab  # noqa: E402
from disan.train.checkpoint import load_checkpoint  # noqa: E402
from research import widen as W  # noqa: E402
from research.cli import main  # noqa: E402

WORDS = [f"w{i}" for i in range(30)]
TEXTS = ["w1 w2 w3 w4", "w5", "w6 w7 w8 w9 w10 w11 w12 w13 w14", "w3 unknown w2"]


@pytest.fixture
def student(tmp_path: Path) -> Path:
    """A tiny encoder (d_h 4, random weights, biases made non-zero) serving 6-d vectors."""
    path = make_tiny_checkpoint(tmp_path / "student.pt", "encoder", Vocab(WORDS), [], seed=3,
                                proj_dim=6, keep_prob=0.9, d_h=4)
    payload = load_checkpoint(path)
    gen = torch.Generator().manual_seed(0)
    for name, tensor in payload["model_state"].items():
        if name.endswith("bias") or name.endswith("b1"):
            tensor += 0.3 * torch.randn(tensor.shape, generator=gen)
    torch.save(payload, path)
    return path


def vectors(payload: dict) -> torch.Tensor:
    encoder = DiSANEncoder(DiSANConfig.from_dict(payload["config"]))
    encoder.load_state_dict(payload["model_state"])
    encoder.eval()
    batch = Vocab(payload["vocab"][2:]).encode(TEXTS)
    with torch.no_grad():
        return encoder(torch.from_numpy(batch.ids), torch.from_numpy(batch.mask))


@pytest.mark.parametrize("d_h", [5, 8, 13])  # tiny d_h is 4: one copy, all doubled, some tripled
def test_wider_encoder_serves_the_same_vectors(student: Path, d_h: int) -> None:
    payload = load_checkpoint(student)
    wide = W.widen(payload, d_h, noise=0.0)
    assert wide["config"]["d_h"] == d_h and wide["model_state"]["fw.w1.weight"].shape == (d_h, d_h)
    assert wide["model_state"]["s2t.map1.linear.weight"].shape == (2 * d_h, 2 * d_h)
    before, after = vectors(payload), vectors(wide)
    assert before.shape == after.shape == (len(TEXTS), 6)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)


def test_noise_moves_the_copies_apart_but_only_a_little(student: Path) -> None:
    payload = load_checkpoint(student)
    wide = W.widen(payload, 8, noise=0.01, seed=1)
    w1 = wide["model_state"]["fw.w1.weight"]
    assert not torch.equal(w1[:4], w1[4:])  # without noise the copies' rows would differ only by g
    before, after = vectors(payload), vectors(wide)
    assert not torch.equal(before, after)
    assert torch.nn.functional.cosine_similarity(before, after).min() > 0.99


def test_copies_spread_evenly() -> None:
    g = W.copies(4, 11, np.random.default_rng(0))
    assert list(g[:4]) == [0, 1, 2, 3]
    counts = np.bincount(g, minlength=4)
    assert counts.sum() == 11 and counts.max() - counts.min() <= 1


def test_widen_refuses_what_it_cannot_keep(tmp_path: Path, student: Path) -> None:
    payload = load_checkpoint(student)
    with pytest.raises(ValueError, match="larger than the checkpoint's 4"):
        W.widen(payload, 4)
    nli = make_tiny_checkpoint(tmp_path / "nli.pt", "nli", Vocab(WORDS), ["a", "b", "c"], seed=0)
    with pytest.raises(ValueError, match="task 'encoder'"):
        W.widen(load_checkpoint(nli), 8)
    additive = make_tiny_checkpoint(tmp_path / "add.pt", "encoder", Vocab(WORDS), [], seed=0,
                                    attention_kind="additive", d_h=4)
    with pytest.raises(ValueError, match="attention_kind 'multi_dim'"):
        W.widen(load_checkpoint(additive), 8)


def test_cli_writes_a_checkpoint_that_names_its_origin(tmp_path: Path, student: Path, capsys) -> None:
    out = tmp_path / "wide.pt"
    assert main(["widen", str(student), str(out), "--d-h", "8", "--noise", "0"]) == 0
    assert "d_h 4 -> 8" in capsys.readouterr().out
    wide = load_checkpoint(out)
    assert wide["widening"]["d_h"] == [4, 8] and wide["widening"]["from"]["file"] == "student.pt"
    assert "optimizer_state" not in wide
    # the served vectors of the file, through the same loader the students' evaluation uses
    np.testing.assert_allclose(checkpoint_encoder(out)(TEXTS), checkpoint_encoder(student)(TEXTS),
                               atol=1e-5)


def test_cli_bad_noise_is_a_one_line_error(tmp_path: Path, student: Path, capsys) -> None:
    assert main(["widen", str(student), str(tmp_path / "w.pt"), "--d-h", "8", "--noise", "-1"]) == 2
    assert "--noise -1.0" in capsys.readouterr().err
