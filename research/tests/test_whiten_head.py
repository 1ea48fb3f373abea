"""research.whiten_head: the whitening of a head's vectors, folded into the head itself."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from conftest import WORDS, make_tiny_checkpoint  # noqa: E402

from disan.text.tokenizer import Vocab  # noqa: E402
from research.whiten_head import fold, main, whitening  # noqa: E402


def vectors_of_a_head(rng, n: int = 500):
    weight, bias = rng.normal(size=(12, 5)), rng.normal(size=12)
    x = rng.normal(size=(n, 5)) * np.array([5, 3, 1, 0.5, 0.1])
    return weight, bias, x, x @ weight.T + bias


@pytest.mark.parametrize("centre", [False, True])
def test_the_folded_head_serves_the_whitened_vectors(centre: bool) -> None:
    weight, bias, x, served = vectors_of_a_head(np.random.default_rng(0))
    mean, linear = whitening(served, 0.5, 4, centre)
    folded_w, folded_b = fold(weight, bias, mean, linear)
    np.testing.assert_allclose(x @ folded_w.T + folded_b, (served - mean) @ linear.T, atol=1e-9)
    assert folded_w.shape == (4, 5)


def test_at_power_one_every_kept_direction_weighs_alike() -> None:
    *_, served = vectors_of_a_head(np.random.default_rng(1))
    mean, linear = whitening(served, 1.0, 5, centre=True)
    spread = np.linalg.norm((served - mean) @ linear.T, axis=0)
    np.testing.assert_allclose(spread, spread[0], rtol=1e-6)
    _, plain = whitening(served, 0.0, 5, centre=True)  # power 0: a rotation onto the axes
    np.testing.assert_allclose(plain @ plain.T, np.eye(5), atol=1e-9)


def test_turned_back_into_the_heads_axes_the_cosines_stay_those_of_the_coordinates() -> None:
    """--keep-width: axes.T @ the scaled coordinates serves D-wide vectors with the same cosines."""
    *_, served = vectors_of_a_head(np.random.default_rng(2))
    mean, linear = whitening(served, 0.5, 4)
    axes = whitening(served, 0.0, 4)[1]

    def cosines(z):
        z = z / np.linalg.norm(z, axis=1, keepdims=True)
        return z @ z.T

    short, wide = (served - mean) @ linear.T, (served - mean) @ (axes.T @ linear).T
    assert wide.shape == served.shape
    np.testing.assert_allclose(cosines(wide), cosines(short), atol=1e-9)


def test_at_half_power_the_loudest_direction_leads_by_the_square_root_of_its_lead() -> None:
    """Centred, every direction kept (research.static_pieces --whiten-power distils the teacher so)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 6)) * np.array([10, 5, 2, 1, 0.5, 0.1]) + 3

    def spread(power: float) -> np.ndarray:
        mean, linear = whitening(x, power, 6, centre=True)
        return np.linalg.norm((x - mean) @ linear.T, axis=0)

    np.testing.assert_allclose(spread(1.0), spread(1.0)[0], rtol=1e-4)
    raw = spread(0.0)  # power 0: the principal coordinates alone
    half = spread(0.5)  # half way: the loudest's lead is its square root
    assert np.all(np.diff(half) < 0)
    assert half[0] / half[-1] == pytest.approx(np.sqrt(raw[0] / raw[-1]), rel=1e-3)


def test_a_head_that_ends_in_a_normalisation_is_whitened_on_its_vectors_before_it(tmp_path) -> None:
    """The same fold as for that head without the normalisation (the same cosines): fitted on the
    linear map of the blocks' output, not on unit vectors, and the normalisation kept."""
    import torch

    from disan.train.checkpoint import load_checkpoint, write_checkpoint

    unit = make_tiny_checkpoint(tmp_path / "unit.pt", "encoder", Vocab(WORDS), [], seed=3, proj_dim=12,
                                unit_length=True)
    payload = load_checkpoint(unit)
    payload["config"]["unit_length"] = False
    write_checkpoint(tmp_path / "plain.pt", payload)
    corpus = tiny_corpus(tmp_path)
    for name in ("unit", "plain"):
        main(["--checkpoint", str(tmp_path / f"{name}.pt"), "--corpus", str(corpus), "--power", "0.5",
              "--dims", "6", "--keep-width", "--unit-length", "--out", str(tmp_path / f"w-{name}.pt")])
    again, plain = load_checkpoint(tmp_path / "w-unit.pt"), load_checkpoint(tmp_path / "w-plain.pt")
    assert again["config"]["unit_length"] and again["config"]["proj_dim"] == 12
    for key in ("proj.weight", "proj.bias"):
        torch.testing.assert_close(again["model_state"][key], plain["model_state"][key])


def tiny_corpus(tmp_path):
    """A `disan distill corpus` folder of WORDS' runs."""
    import hashlib
    import json

    texts = [" ".join(WORDS[i:i + 3 + i % 4]) for i in range(len(WORDS) - 6)]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    body = ("\n".join(texts) + "\n").encode()
    (corpus / "sentences.txt").write_bytes(body)
    (corpus / "corpus.json").write_text(json.dumps({"sha256": hashlib.sha256(body).hexdigest()}))
    return corpus


def test_the_checkpoint_carries_the_map_it_folded(tmp_path) -> None:
    """`whitening` (mean, linear) sends the old head's vector to the new head's: what `disan distill
    student --whiten-targets` applies to the teacher's vectors."""
    import torch

    from disan.distill.loop import encode_texts
    from disan.train.checkpoint import load_checkpoint, model_from_checkpoint

    path = make_tiny_checkpoint(tmp_path / "e.pt", "encoder", Vocab(WORDS), [], seed=3, proj_dim=12)
    corpus = tiny_corpus(tmp_path)
    texts = (corpus / "sentences.txt").read_text().splitlines()
    main(["--checkpoint", str(path), "--corpus", str(corpus), "--power", "0.5", "--dims", "6", "--keep-width",
          "--out", str(tmp_path / "w.pt")])
    before, vocab, _ = model_from_checkpoint(load_checkpoint(path))
    payload = load_checkpoint(tmp_path / "w.pt")
    after, _, _ = model_from_checkpoint(payload)
    with torch.no_grad():
        old = encode_texts(before.encoder if hasattr(before, "encoder") else before, vocab, texts)
        new = encode_texts(after.encoder if hasattr(after, "encoder") else after, vocab, texts)
    mean, linear = (payload["whitening"][k].double().numpy() for k in ("mean", "linear"))
    assert linear.shape == (12, 12)
    np.testing.assert_allclose((old - mean) @ linear.T, new, rtol=1e-3, atol=1e-4)
