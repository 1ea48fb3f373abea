"""`disan pretrain`'s command line (`disan/distill/pretrain_cli.py`): flags refused in one line before any
corpus is read, the teacher caches it names, and --word-vectors-only (tiny corpus, fake encoders)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support_files import FakeWordEncoder, write_corpus_folder  # noqa: E402
from test_distill import _args, _corpus, _no_sts_files  # noqa: E402, F401 (an autouse fixture)

from disan.distill import loop as distill  # noqa: E402
from disan.distill.pretrain_cli import _cached_teacher, _relational_teacher, add_arguments, run, run_corpus  # noqa: E402


def _flags(out: Path, **over) -> argparse.Namespace:
    """`_args` as the parsed flags `run_corpus` reads."""
    return argparse.Namespace(**vars(_args(out, **over)), word_vectors_only=False)


def test_lr_decay_needs_steps(tmp_path: Path) -> None:
    args = _flags(tmp_path, corpus=tmp_path / "missing", lr_decay="cosine", steps=10**9)
    with pytest.raises(ValueError, match="--lr-decay cosine needs --steps"):
        run_corpus(args)


@pytest.mark.parametrize("power", [0.0, -1.0, 1.5])
def test_a_whiten_power_out_of_range_is_refused_before_the_corpus_is_read(tmp_path: Path, power) -> None:
    args = _flags(tmp_path, corpus=tmp_path / "missing", whitened=1.0, whiten_power=power)
    with pytest.raises(ValueError, match=r"--whiten-power must be in \(0, 1\]"):
        run_corpus(args)


@pytest.mark.parametrize("over", [{"distill_weight": -1.0}, {"distill_weight": 0.0}])
def test_a_phase_without_the_teacher_needs_an_anchor(tmp_path: Path, over: dict) -> None:
    args = _flags(tmp_path, corpus=tmp_path / "missing", **over)
    with pytest.raises(ValueError, match="--distill-weight must be positive, or 0 with an --anchor"):
        run_corpus(args)


def test_probe_first_without_the_sentiment_term_is_refused(tmp_path: Path) -> None:
    args = _flags(tmp_path, corpus=tmp_path / "missing", probe_first=True)
    with pytest.raises(ValueError, match="--probe-first fits the sentiment head: it needs"):
        run_corpus(args)


def test_freeze_words_without_a_start_is_refused(tmp_path: Path) -> None:
    args = _flags(tmp_path, corpus=tmp_path / "missing", freeze_words=True)
    with pytest.raises(ValueError, match="--freeze-words keeps a start's word table: it needs --init-from"):
        run_corpus(args)


@pytest.mark.parametrize("over, message", [
    ({"relational_teacher": "mpnet"}, "other than --teacher mpnet"),
    ({"relational_teacher": "glove"}, "one of minilm, mpnet"),
    ({"relational": 0.0}, "needs --relational > 0"),
    ({"relational_mix": 1.5}, "--relational-mix in \\[0, 1\\]"),
])
def test_second_teacher_flags_are_checked(tmp_path: Path, over: dict, message: str) -> None:
    args = _flags(tmp_path, corpus=tmp_path, teacher="mpnet", relational_teacher="minilm", relational=1.0)
    with pytest.raises(ValueError, match=message):
        _relational_teacher(argparse.Namespace(**{**vars(args), **over}), "sha", 10)


def test_an_unknown_teacher_is_a_clear_error(tmp_path: Path) -> None:
    """--teacher glove used to reach TEACHERS["glove"] (a KeyError, a traceback from the CLI)."""
    with pytest.raises(ValueError, match="teacher 'glove': one of minilm, mpnet"):
        _cached_teacher(tmp_path, "glove", "sha", 10)


def _cli_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_word_vectors_only_prepares_what_a_scratch_run_reads(tmp_path: Path, monkeypatch, capsys) -> None:
    """A lease's student from scratch starts from static word vectors the GPU machine cannot make
    (no MiniLM there): `pretrain --corpus ... --word-vectors-only` makes them here for the very
    vocabulary the run will build, and the kit carries them in fp16 (pack.sh)."""
    from disan.train import word_vectors as E
    sentences, teacher = _corpus()
    corpus = write_corpus_folder(tmp_path / "corpus", sentences)
    here, there = tmp_path / "cache-here", tmp_path / "cache-there"
    monkeypatch.setenv("DISAN_CACHE_DIR", str(here))
    monkeypatch.setattr(E, "_sentence_encoder", lambda _source: FakeWordEncoder())
    assert run(_cli_args("--corpus", str(corpus), "--init", "minilm",  # no --out: nothing is written there
                         "--embed-dim", "8", "--vocab-size", "100", "--word-vectors-only")) == 0
    (made,) = here.iterdir()
    assert str(made) in capsys.readouterr().out
    vectors = np.load(made)
    assert vectors.shape == (len(set(" ".join(sentences).split())), 8)
    # the kit's copy, fp16 under the same name in another cache folder, is what a run finds there
    there.mkdir()
    np.save(there / made.name, vectors.astype(np.float16))
    monkeypatch.setenv("DISAN_CACHE_DIR", str(there))
    monkeypatch.setattr(E, "_sentence_encoder", lambda _source: pytest.fail("the words were encoded again"))
    distill.distill(_args(tmp_path / "run", init="minilm", steps=1, eval_every=1), sentences, lambda: teacher)
    assert f"({vectors.shape[0]} from minilm)" in capsys.readouterr().out


def test_a_run_without_out_is_a_clear_error(tmp_path: Path) -> None:
    corpus = write_corpus_folder(tmp_path / "corpus", ["the cat sat", "the cat ran"])
    with pytest.raises(ValueError, match="give --out DIR"):
        run(_cli_args("--corpus", str(corpus)))


@pytest.mark.parametrize("flags, message", [
    (["--texts", "a.txt"], "--word-vectors-only needs --corpus DIR"),
    (["--corpus", "CORPUS", "--init", "glove"], "unknown static word-vector source 'glove'"),
])
def test_word_vectors_only_refuses_what_it_cannot_prepare(tmp_path: Path, flags: list, message: str) -> None:
    """Without --corpus the flag used to be ignored and a whole pre-training run started."""
    corpus = write_corpus_folder(tmp_path / "corpus", ["the cat sat", "the cat ran"])
    argv = [str(corpus) if f == "CORPUS" else f for f in flags]
    with pytest.raises(ValueError, match=message):
        run(_cli_args(*argv, "--out", str(tmp_path / "out"), "--word-vectors-only"))
