"""research.whitening_power: the whitening read back from the heads before and after it, and the
vectors the grid scores are the ones a bundle whitened at that power serves."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from conftest import WORDS, make_tiny_checkpoint  # noqa: E402
from support_files import write_corpus_folder  # noqa: E402

from disan.runtime.encoder import Encoder  # noqa: E402
from disan.text.tokenizer import Vocab  # noqa: E402
from disan.train.checkpoint import load_checkpoint  # noqa: E402
from research.whiten_head import main as whiten_head  # noqa: E402
from research.whiten_head import whitening  # noqa: E402
from research.whitening_power import (  # noqa: E402
    WindowCache,
    head_matrix,
    label,
    map_at,
    power_encoders,
    spectrum_between,
)
from research.whitening_power import main as whitening_power  # noqa: E402


def keep_width(served: np.ndarray, power: float, k: int) -> np.ndarray:
    """research.whiten_head's map at `power`, --keep-width, uncentred."""
    _, linear = whitening(served, power, k)
    return (linear / np.linalg.norm(linear, axis=1, keepdims=True)).T @ linear


def test_the_map_at_any_power_is_read_back_from_the_heads() -> None:
    rng = np.random.default_rng(0)
    head = np.concatenate([rng.normal(size=(12, 5)), rng.normal(size=(12, 1))], axis=1)
    x = np.concatenate([rng.normal(size=(400, 5)) * np.array([5, 3, 1, 0.5, 0.1]), np.ones((400, 1))], 1)
    served = x @ head.T  # rank 6: the fifth direction kept, the sixth dropped (k = 5)
    ratios, axes = spectrum_between(head, keep_width(served, 0.25, 5) @ head, 0.25)
    assert len(ratios) == 5 and ratios[0] == pytest.approx(1.0) and np.all(np.diff(ratios) < 0)
    for power in (0.25, 0.5, 1.0):
        np.testing.assert_allclose(map_at(ratios, axes, power), keep_width(served, power, 5), atol=1e-8)



def test_a_floor_holds_the_quiet_axes_at_its_scale() -> None:
    """Axes under the floor are raised as one at the floor (the same factor, their order kept); the
    ones above it as before; a floor under the smallest ratio is the plain power."""
    rng = np.random.default_rng(1)
    axes = np.linalg.qr(rng.normal(size=(6, 6)))[0].T
    ratios = np.array([1.0, 0.5, 0.2, 0.1, 0.05, 0.01])
    held = axes @ map_at(ratios, axes, 0.5, floor=0.1) @ axes.T  # the map in its own axes: diagonal
    np.testing.assert_allclose(np.diag(held), [1.0, 0.5 ** -0.5, 0.2 ** -0.5, 0.1 ** -0.5, 0.1 ** -0.5,
                                               0.1 ** -0.5])
    np.testing.assert_allclose(held, np.diag(np.diag(held)), atol=1e-12)
    np.testing.assert_allclose(map_at(ratios, axes, 0.5, floor=0.005), map_at(ratios, axes, 0.5))
    assert label(0.5, 0.0) == "P 0.5" and label(0.5, 0.1) == "P 0.5, floor 0.1"


def test_a_ceiling_raises_only_what_is_under_it() -> None:
    """Axes over the ceiling all scale as one at it, so among themselves they keep their shape."""
    rng = np.random.default_rng(2)
    axes = np.linalg.qr(rng.normal(size=(5, 5)))[0].T
    ratios = np.array([1.0, 0.5, 0.2, 0.1, 0.05])
    held = axes @ map_at(ratios, axes, 0.5, ceiling=0.2) @ axes.T
    np.testing.assert_allclose(np.diag(held), [0.2 ** -0.5] * 3 + [0.1 ** -0.5, 0.05 ** -0.5])
    assert label(0.5, 0.0, 0.2) == "P 0.5, ceiling 0.2"
    assert label(0.5, 0.1, 0.2) == "P 0.5, floor 0.1, ceiling 0.2"



def test_write_names_a_power_that_is_not_a_number(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        whitening_power(["--bundle", str(tmp_path), "--before", "b.pt", "--after", "a.pt", "--power", "0.25",
                         "--write", "half", str(tmp_path / "out.pt")])
    assert stop.value.code == 2 and "--write half: a power (a number) expected" in capsys.readouterr().err
    assert not (tmp_path / "out.pt").exists()

def test_the_grid_scores_what_the_whitened_bundle_serves(tmp_path: Path, tiny_checkpoints) -> None:
    """The bundle before, its window vectors mapped at the power read back, equal the bundle whose
    head was whitened at that power (at unit length), a windowed text included."""
    from model_export.export import ExportConfig, build_bundle

    before = make_tiny_checkpoint(tmp_path / "embed.pt", "encoder", Vocab(WORDS), [], seed=5, proj_dim=24)
    rng = random.Random(0)
    corpus = write_corpus_folder(tmp_path / "corpus",
                                 [" ".join(rng.choices(WORDS, k=rng.randint(3, 12))) for _ in range(300)])
    after = tmp_path / "whitened.pt"
    assert whiten_head(["--checkpoint", str(before), "--corpus", str(corpus), "--power", "0.25", "--dims",
                        "16", "--keep-width", "--unit-length", "--out", str(after)]) == 0
    bundles = {}
    for name, embed in (("before", before), ("after", after)):
        bundles[name] = tmp_path / name
        build_bundle(ExportConfig(tiny_checkpoints.nli, tiny_checkpoints.sentiment, bundles[name],
                                  embed=embed, max_len=16, sets=("cpu",)), log=lambda *_: None)
    heads = (head_matrix(load_checkpoint(p)["model_state"]) for p in (before, after))
    ratios, axes = spectrum_between(*heads, 0.25)
    texts = ["a man is playing the guitar", "the dog runs in the park . " * 6, "a very boring movie"]
    served = Encoder(bundles["after"]).encode(texts)
    mapped = WindowCache(Encoder(bundles["before"])).encode(texts, map_at(ratios, axes, 0.25), 2.0)
    np.testing.assert_allclose(mapped, served, atol=2e-4)
    by_power = power_encoders(bundles["before"], before, after, 0.25, [0.25, 0.5])  # the paired tools' way
    assert list(by_power) == ["P 0.25", "P 0.5"]
    np.testing.assert_allclose(by_power["P 0.25"](texts), served, atol=2e-4)
    other = WindowCache(Encoder(bundles["before"])).encode(texts, map_at(ratios, axes, 0.5), 2.0)
    assert np.abs(other - served).max() > 1e-2  # another power serves other vectors
    # --write: the grid's other power as a checkpoint, exported, serves the vectors the grid scored
    written = tmp_path / "at-0.5.pt"
    assert whitening_power(["--bundle", str(bundles["before"]), "--before", str(before), "--after",
                            str(after), "--power", "0.25", "--write", "0.5", str(written)]) == 0
    assert load_checkpoint(written)["whitened"]["power"] == 0.5
    build_bundle(ExportConfig(tiny_checkpoints.nli, tiny_checkpoints.sentiment, tmp_path / "at-0.5",
                              embed=written, max_len=16, sets=("cpu",)), log=lambda *_: None)
    np.testing.assert_allclose(Encoder(tmp_path / "at-0.5").encode(texts), other, atol=2e-4)
