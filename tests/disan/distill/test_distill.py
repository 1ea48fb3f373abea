"""pretrain --corpus: the corpus-scale distillation loop (tiny model, fake teacher)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import loaded, run_texts  # noqa: E402

from disan.distill import loop as distill  # noqa: E402
from disan.distill import supervision  # noqa: E402
from disan.distill.config import DistillConfig  # noqa: E402
from disan.model import DiSANConfig, DiSANEncoder  # noqa: E402
from disan.train.checkpoint import load_checkpoint  # noqa: E402

WORDS = "the cat dog sat ran on a mat rug fast slow red blue big small".split()


def _args(out: Path, **over) -> DistillConfig:
    base = dict(out=out, threads=1, resume=False, vocab_size=100, embed_dim=8, d_h=4, keep_prob=1.0,
                serve_proj=True, contrastive=0.1, relational=0.0, pairs_weight=0.0, temperature=0.05,
                lr=1e-2, seed=0, init="random", batch_size=8, steps=6, eval_every=3, max_minutes=None,
                data=Path("unused"), pair_loss="mse", nli_weight=0.0, init_from=None, device="cpu",
                neighbour_group=0, relational_mix=0.5, lr_decay="none", whitened=0.0,
                whiten_power=0.5, sentiment_weight=0.0, anchor=0.0, probe_first=False,
                distill_weight=1.0, freeze_words=False)
    return DistillConfig(**{**base, **over})


def _corpus(n: int = 80) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(WORDS, size=rng.integers(3, 8))) for _ in range(n)]
    return sentences, rng.standard_normal((n, 6)).astype(np.float16)


@pytest.fixture(autouse=True)
def _no_sts_files(monkeypatch) -> None:
    # STS dev files are staged data; score two fixed pairs instead, through the real encoder.
    def fake(encode, _data, *_sets):
        v = encode(["the cat sat", "a dog ran", "the cat sat on a mat", "big red dog"])
        return {"STS-B dev": float(v[0] @ v[2]), "SICK dev": float(v[1] @ v[3])}
    monkeypatch.setattr(distill, "sts_scores", fake)


def test_trains_checkpoints_and_resumes(tmp_path: Path) -> None:
    sentences, teacher = _corpus()
    distill.distill(_args(tmp_path), sentences, lambda: teacher)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [3, 6]
    best = load_checkpoint(tmp_path / "best.pt")
    assert best["config"]["proj_dim"] == 6  # the served vector lives in the teacher's space
    distill.distill(_args(tmp_path, resume=True, steps=9), sentences, lambda: teacher)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [3, 6, 9]  # continued, not restarted


def test_grows_with_the_teacher_cache(tmp_path: Path, capsys) -> None:
    sentences, teacher = _corpus(200)
    calls = iter([teacher[:40], teacher[:40], teacher[:120]] + [teacher[:200]] * 50)
    distill.distill(_args(tmp_path, steps=12, batch_size=16, eval_every=100), sentences, lambda: next(calls))
    passes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("pass from")]
    assert "train 36" in passes[0] and "train 116" in passes[1]


def test_loss_prefers_the_matching_teacher_vector() -> None:
    target = torch.eye(4)
    loss = distill.distill_loss
    assert loss(target, target, 1.0, 0.05) < loss(target.flip(0), target, 1.0, 0.05)


def test_relational_term_matches_the_teachers_cosines() -> None:
    """--relational scores the batch's cosine matrix: a student whose vectors each point the
    teacher's way but whose pairwise cosines differ pays for it; without the term it does not."""
    target = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    squeezed = torch.tensor([[1.0, 0.0], [0.99, 0.14], [0.0, 1.0]])  # rows 0 and 1 nearly the same
    loss = distill.distill_loss
    assert loss(target, target, 0.0, 0.05, relational=1.0) == pytest.approx(0.0, abs=1e-6)
    gap = loss(squeezed, target, 0.0, 0.05, relational=1.0) - loss(squeezed, target, 0.0, 0.05)
    cos = torch.nn.functional.normalize(squeezed, dim=-1)
    expected = ((cos @ cos.T - target @ target.T) ** 2).mean()
    assert gap == pytest.approx(float(expected), rel=1e-5) and gap > 0.005


def test_a_second_teacher_joins_the_relational_target() -> None:
    """--relational-teacher: the target cosines are the teachers' mixed by --relational-mix; the
    second teacher's vectors may have another size."""
    target = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    second = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])  # all apart
    loss = distill.distill_loss
    alone = loss(target, target, 0.0, 0.05, relational=1.0)
    assert loss(target, target, 0.0, 0.05, 1.0, second, mix=0.0) == pytest.approx(float(alone), abs=1e-6)
    for mix in (0.5, 1.0):
        mixed = (1 - mix) * target @ target.T + mix * second @ second.T
        expected = ((target @ target.T - mixed) ** 2).mean()
        got = loss(target, target, 0.0, 0.05, 1.0, second, mix=mix)
        assert got == pytest.approx(float(expected), rel=1e-5) and got > 0.01


def test_trains_with_a_second_teacher(tmp_path: Path) -> None:
    sentences, teacher = _corpus()
    second = np.random.default_rng(1).standard_normal((len(sentences), 3)).astype(np.float16)
    asked = []

    def second_prefix() -> np.ndarray:
        asked.append(1)
        return second
    distill.distill(_args(tmp_path, relational=1.0, steps=3), sentences, lambda: teacher, second_prefix)
    assert asked and (tmp_path / "best.pt").is_file()


def test_projection_sets_the_served_size() -> None:
    enc = DiSANEncoder(DiSANConfig(vocab_size=10, embed_dim=8, d_h=4, task="encoder", proj_dim=6))
    out = enc(torch.tensor([[2, 3, 0]]), torch.tensor([[True, True, False]]))
    assert out.shape == (1, 6) and enc.out_dim == 6


def test_labelled_pairs_join_the_loss(tmp_path: Path, monkeypatch) -> None:
    asked = []

    def fake_pairs(data):
        asked.append(data)
        return ["the cat sat", "a dog ran"], ["the cat sat on a mat", "big red dog"], np.array([0.9, 0.1])
    monkeypatch.setattr(supervision, "train_pairs", fake_pairs)
    sentences, teacher = _corpus()
    args = _args(tmp_path, pairs_weight=1.0, pair_loss="cosent", steps=3)
    distill.distill(args, sentences, lambda: teacher)
    assert asked == [Path("unused")]


def test_nli_triples_join_the_loss(tmp_path: Path, monkeypatch) -> None:
    triple = (("the", "cat", "sat"), ("a", "cat", "sat"), ("no", "dog", "ran"))
    monkeypatch.setattr(supervision, "nli_triples", lambda data: [triple] * 4)
    sentences, teacher = _corpus()
    distill.distill(_args(tmp_path, nli_weight=1.0, steps=3), sentences, lambda: teacher)
    assert load_checkpoint(tmp_path / "best.pt")["train_config"]["nli_weight"] == 1.0


def test_init_from_goes_on_from_a_trained_student(tmp_path: Path) -> None:
    sentences, teacher = _corpus()
    distill.distill(_args(tmp_path / "a", d_h=6, steps=3), sentences, lambda: teacher)
    first = load_checkpoint(tmp_path / "a" / "best.pt")
    # Flags that disagree with the checkpoint's shape are not used: the student keeps its own.
    distill.distill(_args(tmp_path / "b", d_h=4, steps=3, lr=0.0, keep_prob=1.0,
                          init_from=tmp_path / "a" / "best.pt"), sentences, lambda: teacher)
    second = load_checkpoint(tmp_path / "b" / "best.pt")
    assert second["config"] == first["config"] and second["vocab"] == first["vocab"]
    for name, weight in first["model_state"].items():  # lr 0: the weights went through unchanged
        torch.testing.assert_close(second["model_state"][name], weight)


def test_init_from_names_the_student_it_went_on_from(tmp_path: Path) -> None:
    # A further phase from a student that carries its own origin (here: rebuilt from a bundle) must
    # keep that chain in best.pt and last.pt, through --resume, and into a bundle's manifest.
    from disan.bundle.manifest import sha256_file
    from disan.train.checkpoint import provenance, write_checkpoint

    sentences, teacher = _corpus()
    distill.distill(_args(tmp_path / "a", steps=3), sentences, lambda: teacher)
    origin = {"bundle": "some-bundle", "graphs": {"encoder.onnx": "ab" * 32}}
    start = tmp_path / "start.pt"
    write_checkpoint(start, load_checkpoint(tmp_path / "a" / "best.pt") | {"recovered_from": origin})
    expected = {"file": "start.pt", "sha256": sha256_file(start), "recovered_from": origin}
    distill.distill(_args(tmp_path / "b", steps=3, init_from=start), sentences, lambda: teacher)
    assert load_checkpoint(tmp_path / "b" / "best.pt")["init_from"] == expected
    distill.distill(_args(tmp_path / "b", steps=6, resume=True, init_from=start), sentences,
                    lambda: teacher)
    for name in ("best.pt", "last.pt"):
        assert load_checkpoint(tmp_path / "b" / name)["init_from"] == expected
    best = tmp_path / "b" / "best.pt"
    assert provenance(best, load_checkpoint(best))["init_from"] == expected  # as a manifest names it
    assert "init_from" not in load_checkpoint(tmp_path / "a" / "best.pt")  # a first phase has none


def test_resume_rebuilds_the_students_own_shape(tmp_path: Path) -> None:
    # --resume takes the architecture from last.pt: a resumed --init-from phase (whose shape came
    # from its start checkpoint, not from flags) failed with a size mismatch on the default flags.
    sentences, teacher = _corpus()
    distill.distill(_args(tmp_path, d_h=6, embed_dim=10, serve_proj=False, steps=3), sentences,
                    lambda: teacher)
    distill.distill(_args(tmp_path, resume=True, steps=6), sentences, lambda: teacher)  # flags: d_h 4
    last = load_checkpoint(tmp_path / "last.pt")
    assert last["step"] == 6
    assert (last["config"]["d_h"], last["config"]["embed_dim"], last["config"]["proj_dim"]) == (6, 10, 0)


def test_init_from_refuses_a_student_of_another_teacher(tmp_path: Path) -> None:
    sentences, teacher = _corpus()
    distill.distill(_args(tmp_path / "a", steps=3), sentences, lambda: teacher)
    with pytest.raises(ValueError, match="serves 6-d vectors, the teacher 4-d"):
        distill.distill(_args(tmp_path / "b", init_from=tmp_path / "a" / "best.pt"), sentences,
                        lambda: teacher[:, :4])


def test_checkpoint_encoder_gives_the_trained_vectors(tmp_path: Path) -> None:
    sentences, teacher = _corpus()
    distill.distill(_args(tmp_path, steps=3), sentences, lambda: teacher)
    encode = distill.checkpoint_encoder(tmp_path / "best.pt")
    ckpt = load_checkpoint(tmp_path / "best.pt")
    enc = DiSANEncoder(DiSANConfig.from_dict(ckpt["config"]))
    enc.load_state_dict(ckpt["model_state"])
    enc.eval()
    from disan.text.tokenizer import Vocab

    vocab = Vocab(ckpt["vocab"][2:])
    ids = vocab.text_ids("the cat sat")
    want = enc(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.bool)).detach().numpy()[0]
    np.testing.assert_allclose(encode(["the cat sat"])[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("task", ["nli", "sentiment"])
def test_checkpoint_encoder_reads_a_task_models_encoder(tiny_checkpoints, task: str) -> None:
    # `disan eval --sts --checkpoint nli.pt` once died in load_state_dict: the task model's
    # weights are named encoder.*, and a bare DiSANEncoder was built for them.
    path = getattr(tiny_checkpoints, task)
    model, vocab = loaded(path)
    texts = ["the cat sits", "a dog runs in the park"]
    got = distill.checkpoint_encoder(path)(texts)
    np.testing.assert_allclose(got, run_texts(model.encoder, vocab, texts), rtol=1e-5, atol=1e-6)


def test_resume_takes_the_new_learning_rate(tmp_path: Path) -> None:
    # A cool-down phase resumes with a lower --lr; the saved optimizer state must not override it.
    sentences, teacher = _corpus()
    distill.distill(_args(tmp_path), sentences, lambda: teacher)
    distill.distill(_args(tmp_path, resume=True, steps=9, lr=1e-4), sentences, lambda: teacher)
    state = load_checkpoint(tmp_path / "last.pt")["optimizer_state"]
    assert [g["lr"] for g in state["param_groups"]] == [1e-4]


def test_a_decaying_run_ends_at_a_low_rate_and_a_resume_decays_afresh(tmp_path: Path) -> None:
    sentences, teacher = _corpus()
    distill.distill(_args(tmp_path, lr_decay="linear"), sentences, lambda: teacher)
    state = load_checkpoint(tmp_path / "last.pt")["optimizer_state"]
    assert [g["lr"] for g in state["param_groups"]] == pytest.approx([1e-2 / 6])  # the 6th of 6 steps
    distill.distill(_args(tmp_path, lr_decay="linear", resume=True, steps=9), sentences, lambda: teacher)
    state = load_checkpoint(tmp_path / "last.pt")["optimizer_state"]
    assert [g["lr"] for g in state["param_groups"]] == pytest.approx([1e-2 / 3])  # the 3rd of 3 more


def test_neighbour_batches_train(tmp_path: Path) -> None:
    sentences, teacher = _corpus()
    distill.distill(_args(tmp_path, neighbour_group=4), sentences, lambda: teacher)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [3, 6]


def test_whitened_term_weighs_the_teachers_quiet_directions() -> None:
    """--whitened: a student that gets the teacher's loud direction right and its quiet one wrong
    is nearly perfect by the plain cosine, but not in the evened-out space."""
    from disan.distill.whitening import TeacherWhitening

    rng = np.random.default_rng(0)
    teacher = rng.standard_normal((2000, 2)) * np.array([10.0, 0.3])  # loud x, quiet y
    teacher = np.hstack([teacher, np.full((2000, 1), 20.0)])          # a shared offset, as real ones have
    whiten = TeacherWhitening.fit(teacher, power=1.0)
    target = torch.tensor(teacher[:64], dtype=torch.float32)
    wrong_quiet = target * torch.tensor([1.0, -1.0, 1.0])             # the quiet coordinate flipped
    plain = 1 - torch.nn.functional.cosine_similarity(wrong_quiet, target).mean()
    assert float(plain) < 0.01
    assert float(whiten.loss(wrong_quiet, target)) > 0.5
    assert float(whiten.loss(target, target)) == pytest.approx(0.0, abs=1e-5)
    # half way: the quiet direction counts, less than fully whitened
    assert 0.01 < float(TeacherWhitening.fit(teacher, power=0.5).loss(wrong_quiet, target)) < 0.6
    with pytest.raises(ValueError, match="power"):
        TeacherWhitening.fit(teacher, power=0.0)


def test_trains_with_the_whitened_term(tmp_path: Path) -> None:
    sentences, teacher = _corpus()
    distill.distill(_args(tmp_path, whitened=1.0, steps=3), sentences, lambda: teacher)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 3 and np.isfinite(records[-1]["loss"])


def test_sentiment_phrases_join_the_loss_and_their_head_is_not_exported(tmp_path: Path, monkeypatch) -> None:
    import gzip

    monkeypatch.setattr(supervision, "eval_keys", lambda _data: set())
    data = tmp_path / "data"
    (data / "sst").mkdir(parents=True)
    rows = [{"text": "the cat sat on a mat", "label": 4}, {"text": "a dog ran fast", "label": 0}]
    (data / "sst" / "sst5_phrases_train.jsonl.gz").write_bytes(
        gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    sentences, teacher = _corpus()
    out = tmp_path / "run"
    distill.distill(_args(out, sentiment_weight=1.0, data=data, steps=3), sentences, lambda: teacher)
    best, last = load_checkpoint(out / "best.pt"), load_checkpoint(out / "last.pt")
    assert best["train_config"]["sentiment_weight"] == 1.0
    assert not any(k.startswith("sentiment") for k in best["model_state"])
    assert any(k.startswith("sentiment.") for k in last["student_state"])  # kept for --resume
    probed = []
    monkeypatch.setattr(supervision.SentimentPhrases, "probe",
                        lambda self, enc, head: probed.append(1) or 1.0)
    again = _args(out, sentiment_weight=1.0, data=data, steps=6, resume=True, probe_first=True)
    distill.distill(again, sentences, lambda: teacher)
    assert not probed  # a resume keeps the head it trained; only a fresh phase probes
    distill.distill(_args(tmp_path / "fresh", sentiment_weight=1.0, data=data, steps=1, probe_first=True),
                    sentences, lambda: teacher)
    assert probed == [1]
    assert load_checkpoint(out / "last.pt")["step"] == 6
    # A resume without the term would meet a head it has no place for: refused in one line.
    with pytest.raises(ValueError, match="trained with --sentiment-weight"):
        distill.distill(_args(out, data=data, steps=9, resume=True), sentences, lambda: teacher)


def _mean_cosine_to(start: Path, path: Path, texts: list[str]) -> float:
    a, b = distill.checkpoint_encoder(start)(texts), distill.checkpoint_encoder(path)(texts)
    return float(np.mean(np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)))


def test_anchor_keeps_a_phase_near_the_student_it_started_from(tmp_path: Path) -> None:
    sentences, teacher = _corpus()
    distill.distill(_args(tmp_path / "a", steps=3), sentences, lambda: teacher)
    start = tmp_path / "a" / "best.pt"
    phase = dict(steps=12, keep_prob=1.0, init_from=start)
    distill.distill(_args(tmp_path / "free", **phase), sentences, lambda: teacher)
    distill.distill(_args(tmp_path / "held", anchor=20.0, **phase), sentences, lambda: teacher)
    free, held = (_mean_cosine_to(start, tmp_path / n / "last.pt", sentences) for n in ("free", "held"))
    assert 1.0 - held < 0.5 * (1.0 - free)  # the vectors moved less than half as far
    assert load_checkpoint(tmp_path / "held" / "best.pt")["train_config"]["anchor"] == 20.0


def test_distill_weight_scales_the_teachers_terms(tmp_path: Path) -> None:
    sentences, teacher = _corpus()
    distill.distill(_args(tmp_path / "a", steps=3), sentences, lambda: teacher)
    phase = dict(steps=3, eval_every=3, lr=0.0, keep_prob=1.0, anchor=1.0,
                 init_from=tmp_path / "a" / "best.pt")

    def last_loss(name: str, weight: float) -> float:
        distill.distill(_args(tmp_path / name, distill_weight=weight, **phase), sentences, lambda: teacher)
        return json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[-1])["loss"]

    # lr 0: the student is its start, so the anchor adds nothing and only the teacher's terms remain.
    assert last_loss("off", 0.0) < 1e-4
    assert last_loss("on", 1.0) > 0.1


def test_freeze_words_keeps_the_starts_table_and_trains_the_rest(tmp_path: Path) -> None:
    sentences, teacher = _corpus()
    distill.distill(_args(tmp_path / "a", steps=3), sentences, lambda: teacher)
    start = load_checkpoint(tmp_path / "a" / "best.pt")["model_state"]
    phase = dict(steps=6, lr=5e-2, init_from=tmp_path / "a" / "best.pt")
    distill.distill(_args(tmp_path / "free", **phase), sentences, lambda: teacher)
    distill.distill(_args(tmp_path / "frozen", freeze_words=True, **phase), sentences, lambda: teacher)
    free, frozen = (load_checkpoint(tmp_path / n / "last.pt")["model_state"] for n in ("free", "frozen"))
    assert not torch.equal(free["embed.weight"], start["embed.weight"])
    assert torch.equal(frozen["embed.weight"], start["embed.weight"])
    moved = [n for n, w in frozen.items() if n != "embed.weight" and not torch.equal(w, start[n])]
    assert moved  # the rest of the encoder trained
    # A resume keeps the table frozen as well (the flag is given again, as every resume's flags are).
    distill.distill(_args(tmp_path / "frozen", freeze_words=True, resume=True, **{**phase, "steps": 9}),
                    sentences, lambda: teacher)
    again = load_checkpoint(tmp_path / "frozen" / "last.pt")["model_state"]
    assert torch.equal(again["embed.weight"], start["embed.weight"])


@pytest.mark.parametrize("first, again", [(True, False), (False, True)])
def test_a_resume_must_freeze_the_words_as_its_run_did(tmp_path: Path, first: bool, again: bool) -> None:
    sentences, teacher = _corpus()
    distill.distill(_args(tmp_path / "a", steps=3), sentences, lambda: teacher)
    phase = dict(steps=3, init_from=tmp_path / "a" / "best.pt")
    distill.distill(_args(tmp_path / "b", freeze_words=first, **phase), sentences, lambda: teacher)
    done = "with" if first else "without"
    with pytest.raises(ValueError, match=rf"last\.pt: trained {done} --freeze-words; resume it the same way"):
        distill.distill(_args(tmp_path / "b", freeze_words=again, resume=True, **{**phase, "steps": 6}),
                        sentences, lambda: teacher)


def test_a_phase_held_by_its_anchor_alone_trains_on_sentences_the_teacher_has_not_encoded(
        tmp_path: Path, capsys) -> None:
    sentences, teacher = _corpus()
    distill.distill(_args(tmp_path / "a", steps=3), sentences, lambda: teacher)
    capsys.readouterr()
    phase = dict(steps=3, anchor=1.0, init_from=tmp_path / "a" / "best.pt")
    distill.distill(_args(tmp_path / "held", distill_weight=0.0, **phase), sentences, lambda: teacher[:20])
    assert "train 78, val 2 sentences" in capsys.readouterr().out  # all 80 rows but the val slice
    distill.distill(_args(tmp_path / "taught", **phase), sentences, lambda: teacher[:20])
    assert "train 18, val 2 sentences" in capsys.readouterr().out  # only the encoded rows


def test_anchor_needs_a_student_to_stay_near(tmp_path: Path) -> None:
    sentences, teacher = _corpus()
    with pytest.raises(ValueError, match="--anchor needs --init-from"):
        distill.distill(_args(tmp_path, anchor=1.0), sentences, lambda: teacher)


def test_a_resumed_anchor_must_have_the_students_shape(tmp_path: Path) -> None:
    sentences, teacher = _corpus()
    distill.distill(_args(tmp_path / "a", steps=3), sentences, lambda: teacher)
    distill.distill(_args(tmp_path / "wide", steps=3, d_h=6), sentences, lambda: teacher)
    phase = _args(tmp_path / "a", steps=6, resume=True, anchor=1.0, init_from=tmp_path / "wide" / "best.pt")
    with pytest.raises(ValueError, match=r"--anchor: .*wide.best\.pt has another shape"):
        distill.distill(phase, sentences, lambda: teacher)
