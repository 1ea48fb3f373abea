"""disan.distill.student: a piece-reading student distilled from a teacher cache, with pairs and
Matryoshka prefixes; disan.text.pieces: the tokenizer it carries."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")

from student_tiny import tiny_fixture  # noqa: E402, F401  (the `tiny` fixture)

from disan.distill.corpus import build as corpus  # noqa: E402
from disan.distill.student.config import StudentConfig  # noqa: E402
from disan.distill.student.rows import PieceRows, piece_vectors  # noqa: E402
from disan.distill.student.train import student_loss, train_student  # noqa: E402
from disan.text.pieces import PieceTokenizer  # noqa: E402
from disan.train.checkpoint import load_checkpoint  # noqa: E402


def test_piece_rows_hold_each_text_cut_to_its_limit(tiny) -> None:
    _, path = tiny
    tok = PieceTokenizer.from_file(path)
    texts = ["river storm farmer cattle council", "", "zzzqqq"]
    rows = PieceRows(tok, texts, max_pieces=3)
    ids, mask = rows.batch(np.array([0, 1, 2]), "cpu")
    assert rows.lengths.tolist()[0] == 3 and ids.shape[1] == 3
    assert ids[0].tolist() == tok.batch_ids(texts[:1])[0][:3]
    assert mask[1].sum() == 1  # an empty text still has one position to read
    assert all(0 < i < len(tok) for i in tok.batch_ids(["anything at all, even ünïcode"])[0])


def test_piece_vectors_start_from_the_teacher(tiny, tmp_path) -> None:
    _, path = tiny
    tok = PieceTokenizer.from_file(path)
    seen = []

    def encode(texts):
        seen.extend(texts)
        return np.random.default_rng(2).normal(size=(len(texts), 12))

    table = piece_vectors(tok, 4, encode, tmp_path / "p.npy")
    assert table.shape == (len(tok), 4) and not table[0].any() and table[1:].any()
    assert "river" in seen or any(not s.startswith("##") for s in seen)
    assert np.array_equal(piece_vectors(tok, 4, None, tmp_path / "p.npy"), table)  # cached


def test_matryoshka_loss_counts_every_prefix() -> None:
    cfg = StudentConfig(corpus=Path("."), out=Path("."), dims=(4, 2), proj_dim=4)
    pred, target = torch.randn(6, 4), torch.randn(6, 4)
    q, p = torch.randn(5, 4), torch.randn(5, 4)
    _, parts = student_loss(pred, target, q, p, cfg)
    one = StudentConfig(corpus=Path("."), out=Path("."), dims=(4,), proj_dim=4)
    _, only_full = student_loss(pred, target, q, p, one)
    assert parts["mnr"] > only_full["mnr"] and parts["geometry"] > only_full["geometry"]
    assert parts["distill"] == pytest.approx(only_full["distill"])


def test_a_student_trains_and_carries_its_tokenizer(tiny, tmp_path) -> None:
    root, path = tiny
    cfg = StudentConfig(corpus=root / "corpus", out=tmp_path / "s", tokenizer=path, embed_dim=8, d_h=8,
                        proj_dim=16, dims=(16, 8), batch_size=16, pairs_batch=8, steps=40, val_rows=16,
                        eval_every=20, lr=3e-3)
    rng = np.random.default_rng(3)
    last = train_student(cfg, teacher_encode=lambda texts: rng.normal(size=(len(texts), 12)))
    assert last["step"] == 40 and {"val_cosine", "pair_acc@16", "pair_acc@8"} <= set(last)
    payload = load_checkpoint(tmp_path / "s" / "student.pt")
    assert PieceTokenizer.from_str(payload["tokenizer"]).batch_ids(["river"]) == \
        PieceTokenizer.from_file(path).batch_ids(["river"])
    assert payload["matryoshka_dims"] == [16, 8] and payload["config"]["proj_dim"] == 16
    assert not any("/" in str(v) for v in payload["train_config"].values())  # no machine paths
    lines = (tmp_path / "s" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 20, 40]  # the fitted start, then each evaluation


def test_a_relation_the_corpus_lacks_is_refused_before_any_training(tiny, tmp_path) -> None:
    root, path = tiny
    cfg = StudentConfig(corpus=root / "corpus", out=tmp_path / "s", tokenizer=path, embed_dim=8, d_h=8,
                        proj_dim=16, dims=(16,), steps=1, relations=("heading", "cloze"))
    with pytest.raises(ValueError, match=r"--relations cloze: .* has no such pairs \(it has: heading\)"):
        train_student(cfg)
    assert not (tmp_path / "s").exists()


def test_the_cli_builds_the_config_from_its_flags(tmp_path) -> None:
    import argparse

    from disan.distill.student import cli as student_cli

    parser = argparse.ArgumentParser()
    student_cli.add_arguments(parser)
    args = parser.parse_args(["--corpus", "c", "--out", str(tmp_path), "--dims", "64", "32", "--steps", "7",
                              "--lr", "0.01", "--max-minutes", "2.5", "--relations", "heading"])
    cfg = student_cli.config(args)
    assert (cfg.dims, cfg.steps, cfg.lr, cfg.max_minutes, cfg.relations) == ((64, 32), 7, 0.01, 2.5,
                                                                             ("heading",))
    assert cfg.corpus == Path("c") and cfg.teacher is None and cfg.batch_size == 128


def test_init_and_resume_runs_do_not_load_the_teacher_for_a_table_they_have(tmp_path, monkeypatch) -> None:
    import argparse

    from disan.distill import teacher
    from disan.distill.student import cli as student_cli

    def no_teacher(*args, **kwargs):
        raise AssertionError("the teacher was loaded")

    seen = []
    monkeypatch.setattr(teacher, "sentence_transformer_encoder", no_teacher)
    monkeypatch.setattr(student_cli, "train_student", lambda cfg, teacher_encode: seen.append(teacher_encode))
    parser = argparse.ArgumentParser()
    student_cli.add_arguments(parser)
    args = parser.parse_args(["--corpus", "c", "--out", str(tmp_path / "new"), "--init", "old/student.pt"])
    assert student_cli.run(args) == 0 and seen == [None]
    assert student_cli.config(args).init == Path("old/student.pt")
    # a resumed run's weights (the table among them) come from its state.pt
    args = parser.parse_args(["--corpus", "c", "--out", str(tmp_path / "other"), "--resume"])
    assert student_cli.run(args) == 0 and seen == [None, None]


def test_length_sorted_parts_give_the_vectors_of_one_batch(tiny) -> None:
    from disan.model import DiSANConfig, DiSANEncoder

    _, path = tiny
    tok = PieceTokenizer.from_file(path)
    texts = ["river", "storm farmer cattle council shelter road water kernel", "", "query answer question",
             "disk file network packet server client query answer question title river storm"]
    rows = PieceRows(tok, texts, max_pieces=16)
    torch.manual_seed(0)
    encoder = DiSANEncoder(DiSANConfig(vocab_size=len(tok), embed_dim=8, d_h=8, task="encoder",
                                       proj_dim=12)).eval()
    chosen = np.array([4, 0, 1, 3, 2, 0])
    with torch.no_grad():
        whole = encoder(*rows.batch(chosen, "cpu"))
        for buckets in (2, 3, 6, 9):
            assert torch.allclose(rows.encode(encoder, chosen, "cpu", buckets), whole, atol=1e-5)


def test_windowed_rows_give_the_vectors_the_embed_route_serves(tiny) -> None:
    from disan.model import DiSANConfig, DiSANEncoder
    from disan.text.windowing import EMBEDDING_LEAD, pool_windows, split_windows

    _, path = tiny
    tok = PieceTokenizer.from_file(path)
    long = ("disk file network packet server client query answer question title river storm farmer cattle "
            "council shelter road water kernel module driver memory page cache")
    texts = ["river storm", long, "query answer"]
    cut, windowed = PieceRows(tok, texts, max_pieces=6), PieceRows(tok, texts, max_pieces=6, windows=True)
    torch.manual_seed(0)
    encoder = DiSANEncoder(DiSANConfig(vocab_size=len(tok), embed_dim=8, d_h=8, task="encoder",
                                       proj_dim=12)).eval()
    chosen = np.array([1, 0, 2, 1])
    ids = tok.batch_ids(texts[1:2])[0]
    assert len(ids) > 12  # three windows at least: the pooling is not one window's vector
    with torch.no_grad():
        got = windowed.encode(encoder, chosen, "cpu", buckets=2)
        parts = split_windows(ids, 6)
        each = torch.cat([encoder(*windowed_batch(w)) for w in parts]).numpy()
        served = pool_windows(each, [len(w) for w in parts], EMBEDDING_LEAD)
        short = cut.encode(encoder, chosen, "cpu")
    assert np.allclose(got[0].numpy(), served, atol=1e-5) and np.allclose(got[3].numpy(), served, atol=1e-5)
    assert torch.allclose(got[[1, 2]], short[[1, 2]], atol=1e-5)  # a text that fits is read as before
    first = encoder(*windowed_batch(ids[:6])).detach()[0]
    assert torch.allclose(short[0], first, atol=1e-5)  # without windows a long text is its first window
    assert not torch.allclose(got[0], short[0], atol=1e-3)


def windowed_batch(ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.tensor([ids])
    return x, torch.ones_like(x, dtype=torch.bool)


def test_a_windowed_run_reads_its_long_rows_in_windows(tiny, tmp_path) -> None:
    root, path = tiny
    values = dict(corpus=root / "corpus", tokenizer=path, embed_dim=8, d_h=8, proj_dim=16, dims=(16,),
                  batch_size=16, pairs_batch=8, steps=1, val_rows=16, eval_every=1, max_pieces=4, seed=5)
    table = lambda texts: np.random.default_rng(3).normal(size=(len(texts), 12))  # noqa: E731
    cut = train_student(StudentConfig(out=tmp_path / "cut", **values), teacher_encode=table)
    windowed = train_student(StudentConfig(out=tmp_path / "win", windows=True, **values),
                             teacher_encode=table)
    assert windowed["val_cosine"] != cut["val_cosine"]
    assert load_checkpoint(tmp_path / "win" / "student.pt")["model_state"].keys() == \
        load_checkpoint(tmp_path / "cut" / "student.pt")["model_state"].keys()


def test_a_resumed_run_ends_where_one_run_ends(tiny, tmp_path) -> None:
    root, path = tiny

    def config(out: Path, **kw) -> StudentConfig:
        values = dict(corpus=root / "corpus", out=out, tokenizer=path, embed_dim=8, d_h=8, proj_dim=16,
                      dims=(16, 8), batch_size=16, pairs_batch=8, steps=12, val_rows=16, eval_every=6,
                      lr=3e-3)
        return StudentConfig(**(values | kw))

    table = lambda texts: np.random.default_rng(3).normal(size=(len(texts), 12))  # noqa: E731
    whole = train_student(config(tmp_path / "one"), teacher_encode=table)
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "pieces.npy").write_bytes((tmp_path / "one" / "pieces.npy").read_bytes())
    train_student(config(tmp_path / "two", max_minutes=0.0))  # stops after its first step
    assert torch.load(tmp_path / "two" / "state.pt", weights_only=False)["step"] == 1
    with pytest.raises(ValueError, match="other lr"):
        train_student(config(tmp_path / "two", resume=True, lr=1e-3))
    resumed = train_student(config(tmp_path / "two", resume=True))
    assert resumed["step"] == 12 and resumed["val_cosine"] == pytest.approx(whole["val_cosine"], abs=1e-4)
    a = load_checkpoint(tmp_path / "one" / "student.pt")["model_state"]
    b = load_checkpoint(tmp_path / "two" / "student.pt")["model_state"]
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_a_run_can_start_from_an_earlier_student(tiny, tmp_path) -> None:
    root, path = tiny
    values = dict(corpus=root / "corpus", tokenizer=path, embed_dim=8, d_h=8, proj_dim=16, dims=(16, 8),
                  batch_size=16, pairs_batch=8, steps=6, val_rows=16, eval_every=6, lr=3e-3)
    table = lambda texts: np.random.default_rng(3).normal(size=(len(texts), 12))  # noqa: E731
    first = train_student(StudentConfig(out=tmp_path / "one", **values), teacher_encode=table)
    init = tmp_path / "one" / "student.pt"
    train_student(StudentConfig(out=tmp_path / "two", init=init, **(values | {"steps": 2})),
                  teacher_encode=table)
    start = json.loads((tmp_path / "two" / "metrics.jsonl").read_text().splitlines()[0])
    assert start["step"] == 0 and start["val_cosine"] == pytest.approx(first["val_cosine"], abs=1e-4)
    with pytest.raises(ValueError, match="differs from this run in d_h"):
        train_student(StudentConfig(out=tmp_path / "three", init=init, **(values | {"d_h": 4})),
                      teacher_encode=table)
    with pytest.raises(ValueError, match="rotate_teacher"):
        train_student(StudentConfig(out=tmp_path / "four", init=init, **(values | {"rotate_teacher": False})),
                      teacher_encode=table)


def test_a_piece_checkpoint_reads_text_through_its_pieces(tiny, tmp_path) -> None:
    from disan.distill.loop import checkpoint_encoder

    root, path = tiny
    cfg = StudentConfig(corpus=root / "corpus", out=tmp_path / "s", tokenizer=path, embed_dim=8, d_h=8,
                        proj_dim=16, dims=(16,), batch_size=16, pairs_batch=8, steps=2, val_rows=16,
                        eval_every=2)
    train_student(cfg, teacher_encode=lambda texts: np.random.default_rng(4).normal(size=(len(texts), 12)))
    encode = checkpoint_encoder(tmp_path / "s" / "student.pt")
    vecs = encode(["river storm", "zzz unseen ünïcode", "river storm", "cattle council"])
    assert vecs.shape == (4, 16) and np.allclose(vecs[0], vecs[2], atol=1e-6) and np.isfinite(vecs).all()
    assert not np.allclose(vecs[0], vecs[3], atol=1e-3)  # words, not one unknown row for everything


def test_the_head_starts_as_the_ridge_map_to_the_teacher(tiny) -> None:
    from disan.distill.student.starts import fit_head
    from disan.model import DiSANConfig, DiSANEncoder

    root, path = tiny
    tok = PieceTokenizer.from_file(path)
    texts, _ = corpus.read_corpus(root / "corpus")
    rows = PieceRows(tok, texts, max_pieces=16)
    torch.manual_seed(0)
    encoder = DiSANEncoder(DiSANConfig(vocab_size=len(tok), embed_dim=8, d_h=8, task="encoder", proj_dim=6))
    chosen = np.arange(len(texts))
    proj, encoder.proj = encoder.proj, None  # the teacher: a linear map of the vectors before the head
    with torch.no_grad():
        feats = rows.encode(encoder.eval(), chosen, "cpu").numpy()
    encoder.proj = proj
    target = (feats @ np.random.default_rng(5).normal(size=(16, 6)) + 0.5).astype(np.float32)
    cfg = StudentConfig(corpus=root, out=root, proj_dim=6)
    encoder.train()
    fit_head(encoder, rows, target, chosen, cfg, ridge=1e-9)
    assert encoder.training  # left as it was found
    with torch.no_grad():
        got = rows.encode(encoder.eval(), chosen, "cpu")
    np.testing.assert_allclose(got.numpy(), target, atol=1e-3)  # a linear teacher is fitted exactly


def test_warmup_then_linear_decay_and_a_slower_head(tiny, tmp_path) -> None:
    root, path = tiny
    cfg = StudentConfig(corpus=root / "corpus", out=tmp_path / "s", tokenizer=path, embed_dim=8, d_h=8,
                        proj_dim=16, dims=(16,), batch_size=16, pairs_batch=8, steps=8, val_rows=16,
                        eval_every=4, lr=1e-2, warmup_steps=4, head_lr_scale=0.1, fit_head_rows=32)
    train_student(cfg, teacher_encode=lambda texts: np.random.default_rng(4).normal(size=(len(texts), 12)))
    state = torch.load(tmp_path / "s" / "state.pt", weights_only=False)
    body, head = (g["lr"] for g in state["optimizer"]["param_groups"])
    assert body == pytest.approx(0.0) and head == pytest.approx(0.0)  # at the last step: decayed to zero
    lines = [json.loads(x) for x in (tmp_path / "s" / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["step"] == 0 and "val_cosine" in lines[0]  # the fitted start is measured
    assert [g["initial_lr"] for g in state["optimizer"]["param_groups"]] == pytest.approx([1e-2, 1e-3])


def test_the_token_table_can_learn_faster_than_the_blocks(tiny, tmp_path) -> None:
    root, path = tiny
    common = dict(corpus=root / "corpus", tokenizer=path, embed_dim=8, d_h=8, proj_dim=16, dims=(16,),
                  batch_size=16, pairs_batch=8, steps=6, val_rows=16, eval_every=3, lr=1e-3,
                  warmup_steps=1, fit_head_rows=32)
    moved = {}
    teacher = lambda texts: np.random.default_rng(4).normal(size=(len(texts), 12))  # noqa: E731
    for scale in (1.0, 30.0):
        cfg = StudentConfig(out=tmp_path / f"s{scale}", table_lr_scale=scale, **common)
        train_student(cfg, teacher_encode=teacher)
        state = torch.load(cfg.out / "state.pt", weights_only=False)
        start = torch.from_numpy(np.load(cfg.out / "pieces.npy")).float()
        moved[scale] = (state["model"]["embed.weight"].float() - start).abs().max().item()
        if scale != 1.0:
            lrs = [g["initial_lr"] for g in state["optimizer"]["param_groups"]]
            assert lrs == pytest.approx([1e-3, 1e-3, 3e-2])  # blocks, head, table
    assert moved[30.0] > 10 * moved[1.0] > 0
    with pytest.raises(ValueError, match="--tune all"):
        StudentConfig(out=tmp_path / "x", table_lr_scale=2.0, tune="blocks", init=tmp_path / "a.pt", **common)
    with pytest.raises(ValueError, match="above 0"):
        StudentConfig(out=tmp_path / "x", table_lr_scale=0.0, **common)


def test_the_turned_teacher_keeps_every_cosine_and_puts_the_most_first() -> None:
    from disan.distill.student.rows import principal_axes
    from disan.distill.student.train import cosine_matrix

    rng = np.random.default_rng(6)
    q, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    vectors = (rng.normal(size=(300, 6)) * [5, 2, 1, 1, 0.5, 0.1] @ q).astype(np.float32)
    turned = vectors @ principal_axes(vectors).T
    before, after = (cosine_matrix(torch.from_numpy(v)) for v in (vectors, turned))
    np.testing.assert_allclose(after, before, atol=1e-5)
    energy = (turned ** 2).sum(0)
    assert np.all(np.diff(energy) <= 1e-3) and energy[0] > 0.6 * energy.sum()


def test_a_turned_teacher_is_distilled_at_every_prefix() -> None:
    pred, target = torch.randn(6, 4), torch.randn(6, 4)
    both = StudentConfig(corpus=Path("."), out=Path("."), dims=(4, 2), proj_dim=4, geometry_weight=0.0)
    loss, parts = student_loss(pred, target, None, None, both)
    want = sum(1 - torch.nn.functional.cosine_similarity(pred[:, :m], target[:, :m]).mean() for m in (4, 2))
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    plain = StudentConfig(corpus=Path("."), out=Path("."), dims=(4, 2), proj_dim=4, geometry_weight=0.0,
                          rotate_teacher=False)
    only_full = student_loss(pred, target, None, None, plain)[0].item()
    assert only_full == pytest.approx(parts["distill"], rel=1e-5)


def test_a_state_written_before_a_newer_flag_resumes_with_its_default(tmp_path) -> None:
    from disan.distill.student.state import STATE_KEYS, resume_state, save_state
    from disan.model import DiSANConfig, DiSANEncoder

    cfg = StudentConfig(corpus=tmp_path, out=tmp_path, embed_dim=4, d_h=4, proj_dim=8, dims=(8,))
    encoder = DiSANEncoder(DiSANConfig(vocab_size=10, embed_dim=4, d_h=4, task="encoder", proj_dim=8))
    optimizer = torch.optim.AdamW(encoder.parameters())
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    save_state(cfg, 7, encoder, optimizer, schedule, np.random.default_rng(0))
    state = torch.load(tmp_path / "state.pt", weights_only=False)
    assert "tune" in STATE_KEYS
    del state["config"]["tune"]  # as written before --tune existed
    torch.save(state, tmp_path / "state.pt")
    first, _ = resume_state(cfg, encoder, optimizer, schedule)
    assert first == 8
    with pytest.raises(ValueError, match="written with other tune"):
        resume_state(StudentConfig(**{**cfg.__dict__, "tune": "rows", "resume": True}), encoder, optimizer,
                     schedule)


def test_pieces_by_id_name_each_model_id(tiny) -> None:
    _, path = tiny
    tok = PieceTokenizer.from_file(path)
    pieces = tok.pieces_by_id()
    ids = tok.batch_ids(["river storm farmer"])[0]
    assert len(pieces) == len(tok) and pieces[0] == ""
    assert [pieces[i] for i in ids] == tok.tokens("river storm farmer")

