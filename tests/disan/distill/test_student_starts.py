"""disan.distill.student from an earlier student (--init): which parts a phase trains (--tune),
a start that reads whole words, and targets anchored to the start's own vectors (--anchor); a new
student's blocks set to read its table statically (--static-start)."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")

from student_tiny import tiny_fixture  # noqa: E402, F401  (the `tiny` fixture)

from disan.distill.corpus import build as corpus  # noqa: E402
from disan.distill.student.config import StudentConfig  # noqa: E402
from disan.distill.student.rows import PieceRows  # noqa: E402
from disan.distill.student.starts import read_as_static  # noqa: E402
from disan.distill.student.train import train_student  # noqa: E402
from disan.distill.teacher import TeacherCache  # noqa: E402
from disan.model import DiSANConfig, DiSANEncoder  # noqa: E402
from disan.text.pieces import PieceTokenizer  # noqa: E402
from disan.train.checkpoint import load_checkpoint  # noqa: E402


def test_tune_rows_trains_only_the_rows_the_init_marks(tiny, tmp_path) -> None:
    from disan.train.checkpoint import write_checkpoint

    root, path = tiny
    values = dict(corpus=root / "corpus", tokenizer=path, embed_dim=8, d_h=8, proj_dim=16, dims=(16, 8),
                  batch_size=16, pairs_batch=8, steps=3, val_rows=16, eval_every=3, lr=1e-2)
    table = lambda texts: np.random.default_rng(3).normal(size=(len(texts), 12))  # noqa: E731
    train_student(StudentConfig(out=tmp_path / "one", **values), teacher_encode=table)
    start = load_checkpoint(tmp_path / "one" / "student.pt")
    marked = torch.zeros(len(start["model_state"]["trainable_rows"]), dtype=torch.bool)
    marked[1::2] = True
    start["model_state"]["trainable_rows"] = marked
    write_checkpoint(tmp_path / "start.pt", start)

    train_student(StudentConfig(out=tmp_path / "rows", init=tmp_path / "start.pt", tune="rows", **values))
    after = load_checkpoint(tmp_path / "rows" / "student.pt")["model_state"]
    before = start["model_state"]
    assert all(torch.equal(after[k], before[k]) for k in before if k != "embed.weight")  # blocks, head
    moved = (after["embed.weight"] != before["embed.weight"]).any(1)
    assert moved.any() and not moved[~marked].any()

    train_student(StudentConfig(out=tmp_path / "all", init=tmp_path / "start.pt", tune="all", **values))
    after = load_checkpoint(tmp_path / "all" / "student.pt")["model_state"]
    assert (after["embed.weight"] != before["embed.weight"]).any(1)[~marked].any()  # every row learns
    assert not torch.equal(after["proj.weight"], before["proj.weight"])
    with pytest.raises(ValueError, match="give --init"):
        train_student(StudentConfig(out=tmp_path / "fresh", tune="rows", **values), teacher_encode=table)


def test_tune_head_trains_only_the_projection(tiny, tmp_path) -> None:
    """--tune head: the encoder's own vector stays (table and blocks as the start's), the projection
    that maps it to the served vector learns."""
    root, path = tiny
    values = dict(corpus=root / "corpus", tokenizer=path, embed_dim=8, d_h=8, proj_dim=16, dims=(16, 8),
                  batch_size=16, pairs_batch=8, steps=3, val_rows=16, eval_every=3, lr=1e-2)
    table = lambda texts: np.random.default_rng(3).normal(size=(len(texts), 12))  # noqa: E731
    train_student(StudentConfig(out=tmp_path / "one", **values), teacher_encode=table)
    before = load_checkpoint(tmp_path / "one" / "student.pt")["model_state"]

    train_student(StudentConfig(out=tmp_path / "head", init=tmp_path / "one" / "student.pt", tune="head",
                                **values))
    after = load_checkpoint(tmp_path / "head" / "student.pt")["model_state"]
    assert all(torch.equal(after[k], before[k]) for k in before if not k.startswith("proj."))
    assert not torch.equal(after["proj.weight"], before["proj.weight"])
    with pytest.raises(ValueError, match="give --init"):
        train_student(StudentConfig(out=tmp_path / "fresh", tune="head", **values), teacher_encode=table)


def test_a_bad_tune_fails_before_the_corpus_is_read(tmp_path) -> None:
    missing = tmp_path / "no-corpus"
    with pytest.raises(ValueError, match="all, rows, head or blocks"):
        StudentConfig(corpus=missing, out=tmp_path, tune="table")
    with pytest.raises(ValueError, match="give --init"):
        StudentConfig(corpus=missing, out=tmp_path, tune="rows")
    assert StudentConfig(corpus=missing, out=tmp_path, tune="rows", resume=True).tune == "rows"


def test_a_start_that_reads_whole_words_trains_with_its_tokenizer_and_tables(tiny, tmp_path) -> None:
    """`disan distill whole-words` output as --init: the run reads text through its tokenizer (whole
    words too), keeps its tables' layout and the borrowed word table, and trains its own rows."""
    from conftest import make_tiny_checkpoint

    from disan.distill.whole_words import whole_words
    from disan.text.tokenizer import Vocab
    from disan.train.checkpoint import write_checkpoint

    root, path = tiny
    values = dict(corpus=root / "corpus", embed_dim=8, d_h=8, proj_dim=16, dims=(16, 8), batch_size=16,
                  pairs_batch=8, steps=3, val_rows=16, eval_every=3, lr=1e-2)
    table = lambda texts: np.random.default_rng(3).normal(size=(len(texts), 12))  # noqa: E731
    train_student(StudentConfig(out=tmp_path / "one", tokenizer=path, **values), teacher_encode=table)
    pieces = [p for p in PieceTokenizer.from_file(path).pieces_by_id() if p.isalpha() and p.islower()]
    words = Vocab([*pieces, "riverbank", "stormwater"])  # the pieces that are words fit the map
    lender = make_tiny_checkpoint(tmp_path / "w.pt", "encoder", words, [], seed=4, proj_dim=16, embed_dim=8)
    made, report = whole_words(load_checkpoint(tmp_path / "one" / "student.pt"), load_checkpoint(lender))
    assert report["whole_words"] >= 1
    write_checkpoint(tmp_path / "whole.pt", made)

    train_student(StudentConfig(out=tmp_path / "two", init=tmp_path / "whole.pt", tune="rows", **values))
    after = load_checkpoint(tmp_path / "two" / "student.pt")
    assert after["tokenizer"] == made["tokenizer"] and after["config"] == made["config"]
    assert torch.equal(after["model_state"]["borrowed"], made["model_state"]["borrowed"])
    assert not torch.equal(after["model_state"]["embed.weight"], made["model_state"]["embed.weight"])


def test_an_anchored_run_aims_part_of_the_way_back_to_its_start(tiny, tmp_path) -> None:
    """--anchor 1 makes each target the --init student's own vector (cosine 1 at step 0); a share
    between lies between the teacher and the start; a resumed run reads the start's cached vectors."""
    from disan.distill.student.starts import anchored

    root, path = tiny
    values = dict(corpus=root / "corpus", tokenizer=path, embed_dim=8, d_h=8, proj_dim=16, dims=(16, 8),
                  batch_size=16, pairs_batch=8, steps=4, val_rows=16, eval_every=2, lr=3e-3, keep_prob=1.0)
    table = lambda texts: np.random.default_rng(3).normal(size=(len(texts), 12))  # noqa: E731
    train_student(StudentConfig(out=tmp_path / "one", **values), teacher_encode=table)
    init = tmp_path / "one" / "student.pt"

    def start_cosine(out: str, share: float) -> float:
        train_student(StudentConfig(out=tmp_path / out, init=init, anchor=share, **values))
        return json.loads((tmp_path / out / "metrics.jsonl").read_text().splitlines()[0])["val_cosine"]

    stale = tmp_path / "t1" / "anchor.f16.npy"  # another start's file, of the right length
    stale.parent.mkdir()
    np.save(stale, np.random.default_rng(9).normal(size=(len(TeacherCache.read(
        root / "corpus" / "teacher-mpnet").vectors()), 16)).astype(np.float16))
    alone, half, own = start_cosine("t0", 0.0), start_cosine("t5", 0.5), start_cosine("t1", 1.0)
    assert own == pytest.approx(1.0, abs=2e-3)
    assert alone < half < own
    assert (tmp_path / "t1" / "anchor.f16.npy").is_file()
    assert not (tmp_path / "t0" / "anchor.f16.npy").exists()
    cut = train_student(StudentConfig(out=tmp_path / "r", init=init, anchor=1.0, max_minutes=0.0, **values))
    resumed = train_student(StudentConfig(out=tmp_path / "r", init=init, anchor=1.0, resume=True, **values))
    assert cut["step"] == 1 and resumed["step"] == 4 and resumed["val_cosine"] > 0.99

    a, b = np.eye(2, dtype=np.float32), np.array([[0, 3], [3, 0]], np.float32)
    np.testing.assert_allclose(anchored(a, b, 0.5), np.full((2, 2), 0.5 ** 0.5), rtol=1e-6)
    with pytest.raises(ValueError, match="give --init"):
        StudentConfig(corpus=root, out=tmp_path, anchor=0.5)
    with pytest.raises(ValueError, match="between 0 and 1"):
        StudentConfig(corpus=root, out=tmp_path, init=init, anchor=1.5)


def _affine_residual(x: np.ndarray, y: np.ndarray) -> float:
    """Share of y's variance that an affine map of x leaves unexplained."""
    xa = np.hstack([x, np.ones((len(x), 1))])
    w, *_ = np.linalg.lstsq(xa, y, rcond=None)
    return float(((xa @ w - y) ** 2).sum() / ((y - y.mean(0)) ** 2).sum())


@pytest.mark.parametrize("d_h", [4, 8])
def test_a_static_start_reads_its_table_as_a_mean_does(tiny, d_h) -> None:
    root, path = tiny
    tok = PieceTokenizer.from_file(path)
    texts, _ = corpus.read_corpus(root / "corpus")
    rows = PieceRows(tok, texts, max_pieces=16)
    chosen = np.arange(len(texts))
    ids, mask = rows.batch(chosen, "cpu")
    residual = {}
    for static in (False, True):
        torch.manual_seed(0)
        cfg = DiSANConfig(vocab_size=len(tok), embed_dim=8, d_h=d_h, task="encoder", proj_dim=0)
        encoder = DiSANEncoder(cfg)
        with torch.no_grad():
            encoder.embed.weight.normal_(0.0, 0.3)
        if static:
            read_as_static(encoder)
        with torch.no_grad():
            x = encoder.word_vectors(ids)
            mean = ((x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)).numpy()
            vectors = encoder.eval()(ids, mask).double().numpy()
        residual[static] = _affine_residual(mean.astype(np.float64), vectors)
    assert residual[True] < 0.03 < 0.1 < residual[False]  # random blocks: about 0.16


def test_a_static_start_is_for_a_new_student_only(tmp_path) -> None:
    with pytest.raises(ValueError, match="static-start"):
        StudentConfig(corpus=tmp_path, out=tmp_path, static_start=True, init=tmp_path / "start.pt")


def test_tune_blocks_keeps_a_new_students_table(tiny, tmp_path) -> None:
    """--tune blocks: a new student's table stays its start (pieces.npy), the rest learns."""
    root, path = tiny
    values = dict(corpus=root / "corpus", tokenizer=path, embed_dim=8, d_h=4, proj_dim=16, dims=(16, 8),
                  batch_size=16, pairs_batch=8, steps=3, val_rows=16, eval_every=3, lr=1e-2,
                  static_start=True)
    table = lambda texts: np.random.default_rng(3).normal(size=(len(texts), 12))  # noqa: E731
    tables = {}
    for tune in ("blocks", "all"):
        train_student(StudentConfig(out=tmp_path / tune, tune=tune, **values), teacher_encode=table)
        state = load_checkpoint(tmp_path / tune / "student.pt")["model_state"]
        tables[tune] = state["embed.weight"].numpy()
        start = np.load(tmp_path / tune / "pieces.npy")
    np.testing.assert_array_equal(tables["blocks"], start)
    assert not np.array_equal(tables["all"], start)


def tiny_start(tiny, tmp_path) -> tuple[dict, dict]:
    """(the StudentConfig values of a tiny run, the checkpoint it trained in two steps): a start."""
    root, path = tiny
    values = dict(corpus=root / "corpus", tokenizer=path, embed_dim=8, d_h=8, proj_dim=16, dims=(16,),
                  batch_size=16, pairs_batch=8, steps=2, val_rows=16, eval_every=2, lr=1e-3,
                  keep_prob=1.0, rotate_teacher=False)
    table = lambda texts: np.random.default_rng(3).normal(size=(len(texts), 12))  # noqa: E731
    train_student(StudentConfig(out=tmp_path / "one", **values), teacher_encode=table)
    return values, load_checkpoint(tmp_path / "one" / "student.pt")


def test_a_phase_from_a_whitened_unit_length_head_keeps_both(tiny, tmp_path) -> None:
    """A start made by research.whiten_head --unit-length: the phase keeps the normalisation (it
    used to refuse the start as another shape) and, with --whiten-targets, distils the teacher
    through the start's whitening map, which the student carries on."""
    from disan.distill.student.starts import whitened_targets
    from disan.train.checkpoint import write_checkpoint

    values, start = tiny_start(tiny, tmp_path)
    start["config"]["unit_length"] = True
    write_checkpoint(tmp_path / "plain.pt", start)
    linear = np.diag(np.linspace(0.5, 3.0, 16)).astype(np.float32)
    start["whitening"] = {"mean": torch.zeros(16), "linear": torch.from_numpy(linear)}
    write_checkpoint(tmp_path / "white.pt", start)

    train_student(StudentConfig(out=tmp_path / "kept", init=tmp_path / "plain.pt", **values))
    assert load_checkpoint(tmp_path / "kept" / "student.pt")["config"]["unit_length"] is True

    def first_cosine(out: str) -> float:
        return json.loads((tmp_path / out / "metrics.jsonl").read_text().splitlines()[0])["val_cosine"]

    white = dict(init=tmp_path / "white.pt", whiten_targets=True)
    train_student(StudentConfig(out=tmp_path / "w", **white, **values))
    made = load_checkpoint(tmp_path / "w" / "student.pt")
    assert made["config"]["unit_length"] is True
    assert torch.equal(made["whitening"]["linear"], torch.from_numpy(linear))
    assert first_cosine("w") != pytest.approx(first_cosine("kept"), abs=1e-4)  # other targets, same start

    teacher = np.random.default_rng(0).normal(size=(4, 16)).astype(np.float32)
    np.testing.assert_allclose(whitened_targets(teacher, start, "white.pt"), teacher @ linear.T, rtol=1e-5)
    with pytest.raises(ValueError, match="no whitening map"):
        train_student(StudentConfig(out=tmp_path / "x", init=tmp_path / "plain.pt", whiten_targets=True,
                                    **values))
    with pytest.raises(ValueError, match="give --init and --no-rotate-teacher"):
        StudentConfig(**{**values, "rotate_teacher": True}, out=tmp_path, init=tmp_path / "white.pt",
                      whiten_targets=True)


def test_a_phase_held_by_its_start_alone_reads_no_teacher(tiny, tmp_path) -> None:
    """--anchor 1: every target is the start's own vector, so a corpus with no teacher cache trains
    (on its first --anchor-rows rows and its pairs), and the start's whitening map is kept, since
    the phase stays in the start's coordinates."""
    import shutil

    from disan.train.checkpoint import write_checkpoint

    root, path = tiny
    values = dict(tokenizer=path, embed_dim=8, d_h=8, proj_dim=16, dims=(16,), batch_size=16, pairs_batch=8,
                  steps=3, val_rows=16, eval_every=3, lr=3e-3, keep_prob=1.0)
    table = lambda texts: np.random.default_rng(3).normal(size=(len(texts), 12))  # noqa: E731
    train_student(StudentConfig(corpus=root / "corpus", out=tmp_path / "one", **values), teacher_encode=table)
    start = load_checkpoint(tmp_path / "one" / "student.pt")
    start["whitening"] = {"mean": torch.zeros(16), "linear": torch.eye(16)}
    write_checkpoint(tmp_path / "start.pt", start)
    bare = tmp_path / "corpus"
    shutil.copytree(root / "corpus", bare, ignore=shutil.ignore_patterns("teacher-mpnet"))

    held = dict(corpus=bare, init=tmp_path / "start.pt", tune="blocks", **values)
    with pytest.raises(ValueError, match="no teacher cache"):
        train_student(StudentConfig(out=tmp_path / "half", anchor=0.5, **held))
    last = train_student(StudentConfig(out=tmp_path / "own", anchor=1.0, anchor_rows=40, **held))
    first = json.loads((tmp_path / "own" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["val_cosine"] == pytest.approx(1.0, abs=2e-3) and last["step"] == 3
    assert len(np.load(tmp_path / "own" / "anchor.f16.npy")) == 40
    after = load_checkpoint(tmp_path / "own" / "student.pt")
    assert torch.equal(after["whitening"]["linear"], torch.eye(16))
    assert not torch.equal(after["model_state"]["proj.weight"], start["model_state"]["proj.weight"])
    with pytest.raises(ValueError, match="only 20 rows to train on"):
        train_student(StudentConfig(out=tmp_path / "few", anchor=1.0, anchor_rows=20, **held))
    with pytest.raises(ValueError, match="reads no teacher"):
        StudentConfig(out=tmp_path / "w", anchor=1.0, whiten_targets=True, rotate_teacher=False, **held)


def test_check_reads_a_leases_inputs_before_the_teacher(tiny, tmp_path, capsys) -> None:
    """`disan distill student --check`, which research/gpu-lease/device.sh runs before the teacher's
    minutes: a --whiten-targets start without its whitening map (a bundle's recovered encoder), or
    label terms without their staged files, stop at once; good inputs are read and nothing trains."""
    from disan.cli import main
    from disan.train.checkpoint import write_checkpoint

    root, path = tiny
    _, start = tiny_start(tiny, tmp_path)
    write_checkpoint(tmp_path / "plain.pt", start)
    start["whitening"] = {"mean": torch.zeros(16), "linear": torch.eye(16)}
    write_checkpoint(tmp_path / "white.pt", start)
    flags = ["distill", "student", "--corpus", str(root / "corpus"), "--tokenizer", str(path),
             "--embed-dim", "8", "--d-h", "8", "--proj-dim", "16", "--dims", "16", "--no-rotate-teacher",
             "--check"]
    whiten = lambda name: ["--init", str(tmp_path / name), "--whiten-targets"]  # noqa: E731

    assert main([*flags, "--out", str(tmp_path / "a"), *whiten("plain.pt")]) == 2
    assert "carries no whitening map" in capsys.readouterr().err
    labels = ["--scored-weight", "0.5", "--data", str(tmp_path)]  # no staged files there
    assert main([*flags, "--out", str(tmp_path / "b"), *labels]) == 2
    capsys.readouterr()
    shape = [a if a != "16" else "8" for a in flags]  # another width than the start's
    assert main([*shape, "--out", str(tmp_path / "d"), "--init", str(tmp_path / "white.pt")]) == 2
    assert "differs from this run in proj_dim" in capsys.readouterr().err
    assert main([*flags, "--out", str(tmp_path / "c"), *whiten("white.pt")]) == 0
    said = capsys.readouterr().out
    assert said.startswith("inputs read: ") and "and its whitening map" in said
    assert not (tmp_path / "c" / "student.pt").exists()


def test_a_deeper_run_grows_its_start_and_starts_from_its_vectors(tiny, tmp_path) -> None:
    """--layers 2 from a one-layer --init: the start's weights are kept, the new layer's gain starts
    at 0 (the step-0 evaluation is the start's) and then learns; a start with more layers than the
    run is refused."""
    values, start = tiny_start(tiny, tmp_path)
    values = values | {"steps": 3, "eval_every": 3}
    train_student(StudentConfig(out=tmp_path / "same", init=tmp_path / "one" / "student.pt", **values))
    train_student(StudentConfig(out=tmp_path / "deep", init=tmp_path / "one" / "student.pt", layers=2,
                                **values))
    logs = {name: [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").open()]
            for name in ("same", "deep")}
    assert logs["deep"][0]["val_cosine"] == logs["same"][0]["val_cosine"]
    deep = load_checkpoint(tmp_path / "deep" / "student.pt")
    assert deep["config"]["layers"] == 2
    assert deep["model_state"]["upper.0.gain"].abs().max() > 0
    assert set(start["model_state"]) < set(deep["model_state"])  # the start's weights, and the new layer's
    with pytest.raises(ValueError, match="differs from this run in layers"):
        train_student(StudentConfig(out=tmp_path / "back", init=tmp_path / "deep" / "student.pt", **values))
    with pytest.raises(ValueError, match="layers=0"):
        StudentConfig(out=tmp_path / "none", layers=0, **values)
