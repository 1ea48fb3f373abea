"""SentEval-style transfer protocol on a tiny generated data tree with a bag-of-words encoder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")

from support_files import SENTEVAL_WORDS, write_senteval_tree  # noqa: E402

from disan.eval.transfer import bar_chart, evaluate_encoder, markdown_table  # noqa: E402


def bag_of_words(texts: list[str]) -> np.ndarray:
    return np.array([[t.split().count(w) for w in SENTEVAL_WORDS] for t in texts], dtype=np.float32)


@pytest.fixture
def senteval(tmp_path: Path) -> Path:
    return write_senteval_tree(tmp_path)


def test_protocol_scores_a_separable_encoder_high(senteval: Path, tmp_path: Path) -> None:
    scores = evaluate_encoder(bag_of_words, senteval)
    assert set(scores) == {"MR", "CR", "SUBJ", "MPQA", "TREC", "SICK-E", "SICK-R pearson", "SICK-R spearman"}
    assert min(scores[t] for t in ("MR", "CR", "SUBJ", "MPQA", "TREC", "SICK-E")) >= 95.0
    assert scores["SICK-R pearson"] > 90.0
    noise = evaluate_encoder(lambda t: np.random.default_rng(len(t)).normal(size=(len(t), 8)), senteval)
    assert noise["MR"] < 80.0  # the protocol can fail: random vectors do not separate the classes
    table = markdown_table({"bow": scores, "noise": noise})
    assert table.count("\n") == 3 and "| bow |" in table
    bar_chart({"bow": scores, "noise": noise}, tmp_path / "chart.png")
    assert (tmp_path / "chart.png").stat().st_size > 1000


def test_the_tuned_protocol_chooses_the_penalty_on_training_data(senteval: Path) -> None:
    """Many weakly informative columns: C = 1 fits their noise, a C chosen by cross-validation
    inside each training fold averages them (a strong penalty); scores stay held out."""
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    from disan.eval.transfer import classifier, regressor

    rng = np.random.default_rng(0)
    y = np.arange(600) % 2
    x = (y[:, None] - 0.5) * 0.2 + rng.normal(size=(600, 100))
    folds = StratifiedKFold(n_splits=5, shuffle=True, random_state=0)
    fixed = cross_val_score(classifier("fixed"), x, y, cv=folds).mean()
    tuned = cross_val_score(classifier("tuned"), x, y, cv=folds).mean()
    assert tuned > fixed + 0.02, (fixed, tuned)
    assert np.ravel(classifier("tuned").fit(x, y)[-1].C_)[0] <= 0.01
    target = rng.normal(size=600)
    features = np.hstack([target[:, None] + rng.normal(size=(600, 1)), rng.normal(size=(600, 400))])
    r2 = {p: cross_val_score(regressor(p), features, target, cv=5).mean() for p in ("fixed", "tuned")}
    assert r2["tuned"] > r2["fixed"] + 0.05, r2
    scores = evaluate_encoder(bag_of_words, senteval, protocol="tuned")  # the whole suite runs tuned
    assert min(scores[t] for t in ("MR", "CR", "SUBJ", "MPQA", "TREC", "SICK-E")) >= 95.0
    with pytest.raises(ValueError, match="unknown transfer protocol 'senteval'"):
        evaluate_encoder(bag_of_words, senteval, protocol="senteval")


def _gradient(fitted, x: np.ndarray, y: np.ndarray) -> float:
    """The largest component of the gradient of the pipeline's penalised multinomial loss (mean
    log loss + |w|^2 / (2 C n), sklearn's objective) at its fitted weights: 0 at the optimum."""
    *steps, model = fitted
    for step in steps:
        x = step.transform(x)
    x = np.asarray(x, dtype=np.float64)
    logits = x @ model.coef_.T + model.intercept_
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    onehot = np.eye(len(model.classes_))[np.searchsorted(model.classes_, y)]
    return float(np.abs((probs - onehot).T @ x / len(x) + model.coef_ / (model.C * len(x))).max())


def test_the_classifier_is_solved_to_its_optimum_so_a_coordinate_scale_scores_the_same() -> None:
    """SICK-style pair features of correlated vectors. A logistic regression stopped at lbfgs'
    default tolerance (the protocol before 2026-12-04) left a gradient of about 1e-4 there, and
    the shipped bundle's SICK-E moved by up to 1.6 points with the features' dtype or a scale of
    the coordinates that the standardisation undoes."""
    from disan.eval.transfer import classifier

    rng = np.random.default_rng(0)
    y = np.arange(1500) % 3
    z = rng.normal(size=(1500, 30)) + 0.3 * np.eye(3)[y] @ rng.normal(size=(3, 30))
    mix = rng.normal(size=(30, 150))
    u, v = z @ mix, (z + rng.normal(size=z.shape)) @ mix
    x = np.hstack([u, v, np.abs(u - v), u * v]).astype(np.float32)
    fitted = classifier().fit(x[:1000], y[:1000])
    assert _gradient(fitted, x[:1000], y[:1000]) < 1e-6
    scale = np.exp(rng.normal(size=x.shape[1])).astype(np.float32)
    scaled = classifier().fit(x[:1000] * scale, y[:1000])
    np.testing.assert_allclose(scaled.predict_proba(x[1000:] * scale), fitted.predict_proba(x[1000:]),
                               atol=1e-5)


def test_transfer_of_a_checkpoint_scores_its_vectors(senteval: Path, tmp_path: Path, monkeypatch) -> None:
    """`disan eval --transfer --checkpoint`: a student before export, not the bundle."""
    import argparse

    torch = pytest.importorskip("torch")
    from disan.eval import transfer
    from disan.model import DiSANConfig, DiSANEncoder
    from disan.text.tokenizer import Vocab
    from disan.train.checkpoint import save_checkpoint

    vocab = Vocab(SENTEVAL_WORDS)
    torch.manual_seed(0)
    encoder = DiSANEncoder(DiSANConfig(vocab_size=len(vocab), embed_dim=8, d_h=4, task="encoder"))
    save_checkpoint(tmp_path / "student.pt", encoder, vocab, [])

    def no_bundle(_bundle):
        raise AssertionError("the bundle was loaded")
    monkeypatch.setattr(transfer, "disan_encoder", no_bundle)
    args = argparse.Namespace(data=senteval, bundle=Path("unused"), checkpoint=[tmp_path / "student.pt"],
                              baselines="", protocol="fixed", out_dir=tmp_path / "out")
    results = transfer.run_transfer(args)
    assert list(results) == [f"DiSAN checkpoint ({tmp_path / 'student.pt'})"]
    assert set(results[list(results)[0]]) >= {"MR", "TREC", "SICK-E"}
    assert (tmp_path / "out" / "transfer.json").is_file()


def test_a_checkpoint_that_reads_the_bundles_tokenizer_is_scored_through_its_windows(
        tiny_bundle: Path, tiny_checkpoints, tmp_path: Path, capsys) -> None:
    """`disan eval --transfer|--sts --checkpoint` with `--bundle`: a phase from the bundle's encoder
    gives the vectors that bundle would serve, a long text's windows and all (not its first 64
    tokens); a checkpoint of another vocabulary reads its own, each text cut, and says so."""
    pytest.importorskip("torch")
    from conftest import make_tiny_checkpoint

    from disan.eval import transfer
    from disan.text.tokenizer import Vocab

    long_text = "the children are walking in the rain . " * 15 + "a dog is running in the park . " * 15
    texts = [long_text, "a dog"]
    (make,) = transfer.encoders_under_test([tiny_checkpoints.nli], tiny_bundle, "bundle").values()
    # the bundle was exported without --embed: /embed serves the NLI model's encoder
    np.testing.assert_allclose(make()(texts), transfer.disan_encoder(tiny_bundle)(texts), atol=1e-5)
    assert capsys.readouterr().err == ""
    other = make_tiny_checkpoint(tmp_path / "other.pt", "encoder", Vocab(["zebra", "dog"]), [], seed=3)
    (make,) = transfer.encoders_under_test([other], tiny_bundle, "bundle").values()
    assert make()(texts).shape[0] == 2
    assert "cut to 64 tokens" in capsys.readouterr().err
