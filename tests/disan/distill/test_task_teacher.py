"""`disan task-teacher`: a tiny sentence-transformer fine-tuned on a fake SST-5, its soft labels
written resumably, and `disan train --soft-targets` reading them."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sentence_transformers")

from support_files import write_fake_sst5  # noqa: E402
from test_teacher import _tiny_sentence_transformer  # noqa: E402

from disan.cli import main  # noqa: E402
from disan.train import word_vectors as embeddings  # noqa: E402

WORDS = ["a", "man", "plays", "the", "guitar", "dog", "runs"]


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))


@pytest.fixture()
def staged(tmp_path: Path, monkeypatch) -> Path:
    """A fake staged-data folder (SST-5 sentences, phrases, dev, test) and the tiny teacher as MPNet."""
    root = write_fake_sst5(tmp_path / "data", WORDS, sentences=20, more_phrases=17, longest=6)
    folder = _tiny_sentence_transformer(tmp_path / "teacher")
    monkeypatch.setattr(embeddings, "mpnet_model_dir", lambda: folder)
    return root


def _run(root: Path, out: Path) -> int:
    return main(["distill", "task-teacher", "--data", str(root), "--out", str(out), "--epochs", "2",
                 "--batch-size", "4", "--chunk", "8", "--threads", "1", "--lr", "1e-3", "--log-every", "2"])


def test_fits_labels_every_phrase_and_resumes(staged: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "tt"
    assert _run(staged, out) == 0
    steps = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"epoch"')
             and '"step"' in line]
    assert [(r["epoch"], r["step"], r["of"]) for r in steps] == [(e, s, 5) for e in (1, 2) for s in (2, 4)]
    assert all(r["eta_s"] >= 0 for r in steps) and steps[-1]["eta_s"] <= steps[0]["eta_s"]  # 1 step left, 8
    info = json.loads((out / "teacher.json").read_text())
    assert [r["epoch"] for r in info["log"]] == [1, 2] and 0.0 <= info["test_acc_at_best_dev"] <= 1.0
    assert info["best_dev_acc"] == max(r["dev_acc"] for r in info["log"])
    with np.load(out / "soft.npz") as z:
        keys, logits, labels = list(z["keys"]), z["logits"], list(z["labels"])
    phrases = [json.loads(r)["text"] for r in gzip.decompress(
        (staged / "sst/sst5_phrases_train.jsonl.gz").read_bytes()).decode().splitlines()]
    assert keys == list(dict.fromkeys(phrases))  # each distinct training text once, in file order
    assert logits.shape == (len(keys), 5) and np.isfinite(logits).all() and labels == list("01234")
    with np.load(out / "soft_sentences.npz") as z:  # the fine-tuning sentences' rows alone
        sentences = set(phrases[:20])
        taught = ~np.isnan(z["logits"]).any(1)
        assert taught.tolist() == [k in sentences for k in keys] and 0 < taught.sum() < len(keys)
        np.testing.assert_array_equal(z["logits"][taught], logits[taught])

    # a rerun neither fits again nor relabels what is done; a lost chunk is labelled again the same
    fitted = os.stat(out / "teacher.pt").st_mtime_ns
    store = np.load(out / "soft" / "logits.f32.npy", mmap_mode="r+")
    store[8:] = 0.0
    store.flush()
    progress = json.loads((out / "soft" / "progress.json").read_text())
    (out / "soft" / "progress.json").write_text(json.dumps({**progress, "done": 8}))
    assert _run(staged, out) == 0
    assert os.stat(out / "teacher.pt").st_mtime_ns == fitted
    with np.load(out / "soft.npz") as z:
        np.testing.assert_allclose(z["logits"], logits, rtol=1e-4, atol=1e-4)

    # other teacher weights: every example is labelled again, none kept from the old teacher
    state = torch.load(out / "teacher.pt")
    state["head"]["bias"][0] += 1.0
    torch.save(state, out / "teacher.pt")
    assert _run(staged, out) == 0
    with np.load(out / "soft.npz") as z:
        # bf16 autocast where the CPU has it: logits to about 3 significant digits
        np.testing.assert_allclose(z["logits"][:, 0], logits[:, 0] + 1.0, atol=0.02)


def test_train_reads_the_soft_labels(staged: Path, tmp_path: Path) -> None:
    """The keys the teacher writes are the keys training looks its examples up by."""
    from disan.train.checkpoint import load_checkpoint

    out = tmp_path / "tt"
    assert _run(staged, out) == 0
    rc = main(["train", "--task", "sentiment", "--train", str(staged / "sst/sst5_phrases_train.jsonl.gz"),
               "--dev", str(staged / "sst/sst5_dev.jsonl.gz"), "--init", "random", "--embed-dim", "8",
               "--glove-extra", "0", "--d-h", "8", "--epochs", "1", "--no-progress", "--threads", "1",
               "--soft-targets", str(out / "soft.npz"), "--kd-weight", "1", "--out", str(tmp_path / "kd")])
    assert rc == 0
    assert load_checkpoint(tmp_path / "kd" / "best.pt")["train_config"]["kd_weight"] == 1.0


def test_the_eta_is_the_mean_rate_times_the_steps_left() -> None:
    from disan.distill.task_teacher.cli import eta_seconds

    assert eta_seconds(50.0, 10, 100) == 500.0  # 5 s a step, 100 steps to go
    assert eta_seconds(12.5, 5, 0) == 0.0  # the last step


def _fit_only(root: Path, out: Path, *extra: str) -> int:
    """The fit alone (`label` is cut short by the caller), saving every 2 steps."""
    return main(["distill", "task-teacher", "--data", str(root), "--out", str(out), "--epochs", "2",
                 "--batch-size", "4",
                 "--threads", "1", "--lr", "1e-3", "--save-every", "2", *extra])


def _fit_killed_at_step(root: Path, out: Path, step: int, monkeypatch) -> None:
    """The fit of `_fit_only`, killed (KeyboardInterrupt) as it takes its `step`-th step."""
    real_clip, calls = torch.nn.utils.clip_grad_norm_, []

    def dies(*args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            raise KeyboardInterrupt
        return real_clip(*args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", dies)
    with pytest.raises(KeyboardInterrupt):
        _fit_only(root, out)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", real_clip)


def test_an_interrupted_fit_goes_on_from_its_last_save_to_the_same_weights(staged: Path, tmp_path: Path,
                                                                          monkeypatch, capsys) -> None:
    from disan.distill.task_teacher import cli as task_teacher

    class Stop(Exception):
        pass

    def no_labels(*_args, **_kwargs):
        raise Stop  # the fit is what is compared; labelling is tested above

    monkeypatch.setattr(task_teacher, "training_keys", no_labels)
    with pytest.raises(Stop):
        _fit_only(staged, tmp_path / "whole")
    assert not (tmp_path / "whole" / task_teacher.FIT_STATE).exists()  # removed once fitted

    # the same fit, killed during epoch 2's third step (5 steps an epoch; saves after steps 2 and 4)
    _fit_killed_at_step(staged, tmp_path / "cut", 8, monkeypatch)
    assert (tmp_path / "cut" / task_teacher.FIT_STATE).is_file()
    assert not (tmp_path / "cut" / "teacher.json").exists()
    capsys.readouterr()
    with pytest.raises(Stop):
        _fit_only(staged, tmp_path / "cut")
    resumed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"resumed"' in line]
    assert [(r["epoch"], r["step"]) for r in resumed] == [(2, 2)]  # epoch 2's first two steps were saved

    whole, cut = (json.loads((tmp_path / d / "teacher.json").read_text()) for d in ("whole", "cut"))
    for info in (whole, cut):
        for row in info["log"]:
            row.pop("elapsed_s")
    assert cut == whole  # dev accuracy and training loss of each epoch, test accuracy
    a, b = (torch.load(tmp_path / d / "teacher.pt") for d in ("whole", "cut"))
    for part in ("body", "head"):
        for name, tensor in a[part].items():
            torch.testing.assert_close(b[part][name], tensor, rtol=0, atol=0, msg=name)
    assert not (tmp_path / "cut" / task_teacher.FIT_STATE).exists()


def test_a_saved_fit_with_other_settings_is_not_continued(staged: Path, tmp_path: Path, monkeypatch,
                                                          capsys) -> None:
    _fit_killed_at_step(staged, tmp_path / "tt", 3, monkeypatch)
    assert _fit_only(staged, tmp_path / "tt", "--seed", "1") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "an interrupted fit with other settings (seed: 0 there, 1 now)" in err, err


def test_a_fit_saved_in_bf16_is_not_continued_where_auto_means_fp32(staged: Path, tmp_path: Path,
                                                                     monkeypatch, capsys) -> None:
    """`--precision auto` is bf16 on one machine and fp32 on another: the saved settings hold what
    it meant where the fit ran, so a resume elsewhere does not switch precision halfway."""
    from disan.distill import teacher

    monkeypatch.setattr(teacher, "native_bf16", lambda device: True)
    monkeypatch.setattr(teacher, "bf16_faster_on_cpu", lambda: True)
    _fit_killed_at_step(staged, tmp_path / "tt", 3, monkeypatch)
    monkeypatch.setattr(teacher, "native_bf16", lambda device: False)
    assert _fit_only(staged, tmp_path / "tt") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "other settings (precision: 'bf16' there, 'fp32' now)" in err, err


def test_a_fit_saved_with_auto_before_it_was_resolved_goes_on(staged: Path, tmp_path: Path, monkeypatch,
                                                               capsys) -> None:
    from disan.distill import teacher
    from disan.distill.task_teacher import cli as task_teacher

    class Stop(Exception):
        pass

    def no_labels(*_args, **_kwargs):
        raise Stop  # only the fit matters here

    monkeypatch.setattr(teacher, "native_bf16", lambda device: False)
    _fit_killed_at_step(staged, tmp_path / "tt", 3, monkeypatch)
    path = tmp_path / "tt" / task_teacher.FIT_STATE
    state = torch.load(path, weights_only=True)
    assert state["settings"]["precision"] == "fp32"
    state["settings"]["precision"] = "auto"  # as fit states were written before
    torch.save(state, path)
    monkeypatch.setattr(task_teacher, "training_keys", no_labels)
    with pytest.raises(Stop):
        _fit_only(staged, tmp_path / "tt")
    assert '"resumed"' in capsys.readouterr().out
    assert json.loads((tmp_path / "tt" / "teacher.json").read_text())["precision"] == "fp32"


@pytest.mark.parametrize("content", [b"not a checkpoint", b"PK\x03\x04truncated"])
def test_a_fit_state_that_cannot_be_read_is_a_one_line_error(staged: Path, tmp_path: Path, capsys,
                                                             content: bytes) -> None:
    (tmp_path / "tt").mkdir()
    (tmp_path / "tt" / "fit_state.pt").write_bytes(content)
    assert _fit_only(staged, tmp_path / "tt") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "fit_state.pt: not a saved fit" in err and "remove it to start again" in err, err


@pytest.mark.parametrize("flags, message", [
    # SST-5 sentences (labels 0..4) for the two-class recipe: a one-line error, not a torch IndexError
    (["--recipe", "sst2", "--train-file", "sst/sst5_train.jsonl.gz"],
     "label '2' is not one of the recipe's 2 classes 0..1"),
    (["--epochs", "0"], "--epochs 0: give at least 1"),  # nothing fitted: no teacher.pt to label with
    (["--chunk", "0"], "--chunk 0: give at least 1"),
    (["--lr", "0"], "--lr 0.0: give a learning rate above 0"),
    (["--augment", "-1"], "--augment -1: give 0 or more"),
    (["--log-every", "0"], "--log-every 0: give at least 1"),
    (["--save-every", "0"], "--save-every 0: give at least 1"),
    (["--unlabelled", "."], "--unlabelled .: not a `disan corpus` folder"),  # before an hour's fit
])
def test_bad_input_is_a_one_line_error(staged: Path, tmp_path: Path, capsys, flags, message) -> None:
    for split in ("dev", "test"):
        _write(staged / f"sst/sst2_{split}.jsonl.gz", [{"text": "a dog runs", "label": i % 2}
                                                        for i in range(4)])
    rc = main(["distill", "task-teacher", "--data", str(staged), "--out", str(tmp_path / "tt"),
               "--threads", "1",
               *flags])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and message in err, err
    assert not (tmp_path / "tt" / "teacher.pt").exists()


def test_the_two_class_recipe_fits_on_its_own_sentences_by_default(staged: Path, tmp_path: Path) -> None:
    two = [{"text": "a dog runs", "label": 1}, {"text": "the man plays", "label": 0}] * 3
    for name in ("train", "phrases_train", "dev", "test"):
        _write(staged / f"sst/sst2_{name}.jsonl.gz", two)
    assert main(["distill", "task-teacher", "--recipe", "sst2", "--data", str(staged), "--out",
                 str(tmp_path / "tt"),
                 "--epochs", "1", "--threads", "1"]) == 0
    info = json.loads((tmp_path / "tt" / "teacher.json").read_text())
    assert info["train_file"] == "sst/sst2_train.jsonl.gz"


def test_augment_labels_new_variants_resumably_and_train_reads_them(staged: Path, tmp_path: Path) -> None:
    """`--augment N`: variants of the fine-tuning sentences that are not training examples, the
    teacher's logits of them in augmented.npz (resumable as soft/), and `disan train --augmented`."""
    from disan.train.checkpoint import load_checkpoint

    out = tmp_path / "tt"
    assert main(["distill", "task-teacher", "--data", str(staged), "--out", str(out), "--epochs", "1",
                 "--batch-size", "4", "--chunk", "8", "--threads", "1", "--augment", "3"]) == 0
    with np.load(out / "augmented.npz") as z:
        keys, logits, labels = list(z["keys"]), z["logits"], list(z["labels"])
    with np.load(out / "soft.npz") as z:
        training = set(z["keys"])
    assert 20 < len(keys) <= 60 and len(set(keys)) == len(keys) and not set(keys) & training
    assert logits.shape == (len(keys), 5) and np.isfinite(logits).all() and labels == list("01234")
    assert any("<mask>" in k for k in keys)

    store = np.load(out / "augmented" / "logits.f32.npy", mmap_mode="r+")
    store[8:] = 0.0
    store.flush()
    progress = json.loads((out / "augmented" / "progress.json").read_text())
    (out / "augmented" / "progress.json").write_text(json.dumps({**progress, "done": 8}))
    assert main(["distill", "task-teacher", "--data", str(staged), "--out", str(out), "--chunk", "8",
                 "--threads", "1",
                 "--augment", "3"]) == 0
    with np.load(out / "augmented.npz") as z:
        assert list(z["keys"]) == keys
        np.testing.assert_allclose(z["logits"], logits, rtol=1e-4, atol=1e-4)

    rc = main(["train", "--task", "sentiment", "--train", str(staged / "sst/sst5_phrases_train.jsonl.gz"),
               "--dev", str(staged / "sst/sst5_dev.jsonl.gz"), "--init", "random", "--embed-dim", "8",
               "--glove-extra", "0", "--d-h", "8", "--epochs", "1", "--no-progress", "--threads", "1",
               "--soft-targets", str(out / "soft.npz"), "--augmented", str(out / "augmented.npz"),
               "--out", str(tmp_path / "kd")])
    assert rc == 0
    phrases = gzip.decompress((staged / "sst/sst5_phrases_train.jsonl.gz").read_bytes()).decode().splitlines()
    assert load_checkpoint(tmp_path / "kd" / "best.pt")["sizes"]["train"] == len(phrases) + len(keys)


def test_unlabelled_labels_a_corpus_resumably_and_train_reads_it(staged: Path, tmp_path: Path,
                                                                 monkeypatch) -> None:
    """`--unlabelled CORPUS`: a `disan corpus` folder's sentences, each once by its tokens and none
    of them a training example, labelled in chunks (resumable) into unlabelled_<folder>.npz, which
    `disan train --augmented` adds to the training set."""
    from disan.distill.corpus import build as corpus
    from disan.distill.corpus.sources import Source
    from disan.train.checkpoint import load_checkpoint

    phrases = [json.loads(r)["text"] for r in gzip.decompress(
        (staged / "sst/sst5_phrases_train.jsonl.gz").read_bytes()).decode().splitlines()]
    training = max(phrases, key=len)  # a training example, which the student already has
    new = [f"the {a} plays the {b} again ." for a in WORDS for b in WORDS[:3]]  # 21 new sentences
    text = [training, *new, new[0].upper()]  # .upper(): the same tokens, so the same sentence
    monkeypatch.setattr(corpus, "eval_keys", lambda _data: set())
    corpus.build([Source("reviews", "test", "CC0", lambda _root: iter(text), staged=True)], staged,
                 None, tmp_path / "reviews", min_tokens=1)
    out = tmp_path / "tt"
    args = ["distill", "task-teacher", "--data", str(staged), "--out", str(out), "--epochs", "1",
            "--batch-size", "4",
            "--chunk", "8", "--threads", "1", "--unlabelled", str(tmp_path / "reviews")]
    assert main(args) == 0
    target = out / "unlabelled_reviews.npz"
    with np.load(target) as z:
        keys, logits, labels = list(z["keys"]), z["logits"], list(z["labels"])
    assert sorted(keys) == sorted(new)
    assert logits.shape == (len(keys), 5) and np.isfinite(logits).all() and labels == list("01234")

    store = np.load(out / "unlabelled_reviews" / "logits.f32.npy", mmap_mode="r+")
    store[8:] = 0.0
    store.flush()
    progress = json.loads((out / "unlabelled_reviews" / "progress.json").read_text())
    (out / "unlabelled_reviews" / "progress.json").write_text(json.dumps({**progress, "done": 8}))
    assert main(args) == 0
    with np.load(target) as z:
        assert list(z["keys"]) == keys
        np.testing.assert_allclose(z["logits"], logits, rtol=1e-4, atol=1e-4)

    rc = main(["train", "--task", "sentiment", "--train", str(staged / "sst/sst5_phrases_train.jsonl.gz"),
               "--dev", str(staged / "sst/sst5_dev.jsonl.gz"), "--init", "random", "--embed-dim", "8",
               "--glove-extra", "0", "--d-h", "8", "--epochs", "1", "--no-progress", "--threads", "1",
               "--soft-targets", str(out / "soft.npz"), "--augmented", str(target),
               "--out", str(tmp_path / "kd")])
    assert rc == 0
    assert load_checkpoint(tmp_path / "kd" / "best.pt")["sizes"]["train"] == len(phrases) + len(keys)


def test_the_soft_labels_are_stored_compressed(staged: Path, tmp_path: Path) -> None:
    """The keys are a fixed-width array as wide as the longest phrase: one long phrase made SST-5's
    soft.npz 170 MB stored plain, too big to come back from a lent GPU."""
    phrases = staged / "sst/sst5_phrases_train.jsonl.gz"
    rows = gzip.decompress(phrases.read_bytes()).decode()
    long = {"text": " ".join(["guitar"] * 300), "label": 2}
    _write(phrases, [json.loads(r) for r in rows.splitlines()] + [long])
    out = tmp_path / "tt"
    assert _run(staged, out) == 0
    for name in ("soft.npz", "soft_sentences.npz"):
        with np.load(out / name) as z:
            keys, logits = list(z["keys"]), z["logits"]
        assert max(map(len, keys)) == len(long["text"])
        content = sum(len(k.encode()) for k in keys) + logits.nbytes
        assert (out / name).stat().st_size < content + 4096, name  # plain: 38 keys of 2,099 x 4 bytes
