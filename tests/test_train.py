"""Training: optimizer groups, frozen rows, overfitting, the `disan train` CLI end to end, resume."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)  # tiny tensors: threads only add overhead on a shared CPU

from disan.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from disan.cli import main  # noqa: E402
from disan.data import EncodedDataset, Example, encode_dataset, make_dataset  # noqa: E402
from disan.manifest import NLI_LABELS  # noqa: E402
from disan.model import DiSANConfig, build_model  # noqa: E402
from disan.text import Vocab  # noqa: E402
from disan.train import collate, make_optimizer, train_step  # noqa: E402
from disan.train_config import TrainConfig  # noqa: E402

POS = "good great fine wonderful funny moving".split()
NEG = "bad awful boring terrible dull worst".split()
FILL = "the movie film plot is was very really quite".split()
TINY = ["--d-h", "8", "--batch-size", "16", "--no-progress", "--threads", "1", "--glove-extra", "3"]


def sentence(rng: random.Random, positive: bool) -> str:
    words = [rng.choice(FILL) for _ in range(rng.randint(1, 6))]
    words.insert(rng.randint(0, len(words)), rng.choice(POS if positive else NEG))
    return " ".join(words)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Generated sentiment + NLI jsonl splits and a tiny 8-d GloVe text file."""
    root = tmp_path_factory.mktemp("data")
    rng = random.Random(0)
    out = {}
    for split, n in (("train", 48), ("dev", 24), ("test", 24)):
        out[f"sent_{split}"] = root / f"sent_{split}.jsonl"
        out[f"sent_{split}"].write_text("".join(
            json.dumps({"text": sentence(rng, i % 2 == 1), "label": i % 2}) + "\n" for i in range(n)))
        rows = []
        for i in range(n):
            label = ["entailment", "neutral", "contradiction"][i % 3]
            premise = sentence(rng, True)
            hyp = premise if label == "entailment" else sentence(rng, label == "neutral")
            rows.append(json.dumps({"sentence1": premise, "sentence2": hyp, "gold_label": label}) + "\n")
        out[f"nli_{split}"] = root / f"nli_{split}.jsonl"
        out[f"nli_{split}"].write_text("".join(rows))
    out["glove"] = root / "glove.txt"
    out["glove"].write_text("".join(
        w + " " + " ".join(f"{rng.uniform(-1, 1):.4f}" for _ in range(8)) + "\n"
        for w in ["the", ",", "good", "bad", "movie", "cat", "dog", "house", "tree"]))
    return out


def tiny_model(task: str = "sentiment", keep_prob: float = 1.0, vocab: int = 30):
    torch.manual_seed(0)
    cfg = DiSANConfig(vocab_size=vocab, embed_dim=8, d_h=8, head_dim=16, keep_prob=keep_prob, task=task,
                      num_classes=3)
    return build_model(cfg)


def test_optimizer_decays_only_weight_matrices() -> None:
    model = tiny_model()
    opt = make_optimizer(model, TrainConfig(task="sentiment", out="x", weight_decay=1e-4))
    decay, rest = opt.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    assert decay["weight_decay"] == 1e-4 and rest["weight_decay"] == 0.0
    assert all(not n.endswith("bias") and not n.startswith("encoder.embed.") for n in decayed)
    assert "encoder.fw.w1.weight" in decayed and "out.linear.weight" in decayed
    assert {names[id(p)] for p in rest["params"]} >= {"encoder.embed.weight", "encoder.fw.b1"}


@pytest.mark.parametrize("name,cls", [("adadelta", "Adadelta"), ("adam", "Adam")])
def test_optimizer_choice_keeps_the_decay_groups(name: str, cls: str) -> None:
    opt = make_optimizer(tiny_model(), TrainConfig(task="nli", out="x", optimizer=name, lr=0.01))
    assert type(opt).__name__ == cls and [g["weight_decay"] for g in opt.param_groups] == [5e-5, 0.0]


def test_frozen_embedding_rows_do_not_move() -> None:
    model = tiny_model(keep_prob=0.8)
    frozen = torch.tensor([5, 6, 7])
    model.encoder.trainable_rows[frozen] = False
    before = model.encoder.embed.weight.detach().clone()
    opt = make_optimizer(model, TrainConfig(task="sentiment", out="x", weight_decay=1e-2))
    ids = torch.tensor([[5, 6, 7, 8, 9], [7, 5, 10, 11, 0]])
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(ids, ids != 0), torch.tensor([0, 2])).backward()
        opt.step()
    after = model.encoder.embed.weight.detach()
    assert torch.equal(after[frozen], before[frozen])
    assert not torch.equal(after[8:12], before[8:12])  # trainable rows that were used did change


def test_tiny_model_overfits_32_examples() -> None:
    gen = np.random.default_rng(0)
    ids = [(gen.integers(2, 30, size=gen.integers(1, 9)).astype(np.int64),) for _ in range(32)]
    data = EncodedDataset("sentiment", ids, gen.integers(0, 3, size=32))
    model = tiny_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(150):
        _, correct = train_step(model, opt, data, np.arange(32), torch.device("cpu"), max_cells=10**6)
        if correct == 32:
            break
    model.eval()
    from disan.train import collate
    inputs, y = collate(data, np.arange(32))
    assert (model(*inputs).argmax(-1) == y).all()


def run_cli(*args: str) -> int:
    return main(["train", *map(str, args)])


def test_cli_trains_and_writes_a_loadable_checkpoint(files, tmp_path: Path) -> None:
    out = tmp_path / "run"
    rc = run_cli("--task", "sentiment", "--train", files["sent_train"], "--dev", files["sent_dev"],
                 "--test", files["sent_test"], "--glove", files["glove"], "--epochs", "2",
                 "--eval-every", "2", "--out", out, "--label-names", "negative,positive", *TINY)
    assert rc == 0
    for name in ("best.pt", "last.pt", "vocab.json", "metrics.jsonl", "curves.png"):
        assert (out / name).is_file(), name
    best = load_checkpoint(out / "best.pt")
    model, vocab, labels = model_from_checkpoint(best)
    assert labels == ["negative", "positive"] and vocab == Vocab.load(out / "vocab.json")
    assert model.cfg.embed_dim == 8 and "optimizer_state" not in best
    assert {"dev_acc", "test_acc", "test_confusion"} <= set(best["metrics"])
    assert np.sum(best["metrics"]["test_confusion"]) == 24
    assert best["train_config"]["keep_prob"] == 0.7 and best["train_config"]["weight_decay"] == 1e-4
    # GloVe-only words are frozen, training words are not
    rows = model.encoder.trainable_rows
    assert not rows[vocab.stoi["cat"]] and rows[vocab.stoi["movie"]]
    records = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records[:-1]] == [2, 3, 4, 6] and records[-1]["event"] == "final"
    assert "optimizer_state" in load_checkpoint(out / "last.pt")


def test_resume_continues_exactly(files, tmp_path: Path) -> None:
    common = ["--task", "nli", "--train", files["nli_train"], "--dev", files["nli_dev"], "--init", "random",
              "--embed-dim", "8", "--glove-extra", "0", "--eval-every", "0", *TINY[:-2]]
    assert run_cli(*common, "--epochs", "2", "--out", tmp_path / "straight") == 0
    assert run_cli(*common, "--epochs", "1", "--out", tmp_path / "split") == 0
    assert run_cli("--resume", tmp_path / "split" / "last.pt", "--epochs", "2", "--no-progress") == 0
    a = load_checkpoint(tmp_path / "straight" / "last.pt")
    b = load_checkpoint(tmp_path / "split" / "last.pt")
    assert a["step"] == b["step"] == 6 and b["epoch"] == 2
    for key, value in a["model_state"].items():
        assert torch.equal(value, b["model_state"][key]), key
    lines = (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(r).get("step") for r in lines]
    assert steps[:2] == [3, 6]


def test_vocab_reuse_keeps_the_vocab_exactly(files, tmp_path: Path) -> None:
    first = tmp_path / "sent"
    assert run_cli("--task", "sentiment", "--train", files["sent_train"], "--dev", files["sent_dev"],
                   "--glove", files["glove"], "--vocab-texts", files["nli_train"], "--epochs", "1",
                   "--out", first, *TINY) == 0
    second = tmp_path / "nli"
    assert run_cli("--task", "nli", "--train", files["nli_train"], "--dev", files["nli_dev"],
                   "--glove", files["glove"], "--vocab", first / "vocab.json", "--epochs", "1",
                   "--out", second, *TINY) == 0
    assert Vocab.load(second / "vocab.json") == Vocab.load(first / "vocab.json")


def test_bad_data_gives_a_one_line_error(files, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(files["sent_train"].read_text() + '{"text": "oops", "label": \n')
    rc = run_cli("--task", "sentiment", "--train", bad, "--dev", files["sent_dev"], "--out", tmp_path / "o",
                 *TINY)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0
    assert f"{bad}:49: malformed JSON" in err
    rc = run_cli("--task", "nli", "--train", files["sent_train"], "--dev", files["sent_dev"],
                 "--out", tmp_path / "o", *TINY)
    assert rc == 2 and "holds sentiment data but the task is nli" in capsys.readouterr().err


def test_recipes_share_one_vocab_and_hold_out_snli_dev(files, tmp_path: Path) -> None:
    """A fake staged-data tree: `--recipe sst5` and `--recipe nli` must write identical vocabs."""
    import gzip
    import shutil

    root = tmp_path / "data"
    layout = {"mnli/dev_matched.jsonl.gz": "nli_train", "senteval/SICK/sick_train.jsonl.gz": None,
              "snli/dev.jsonl.gz": "nli_dev", "snli/test_tok.jsonl.gz": "nli_test",
              "sst/sst5_train.jsonl.gz": "sent_train", "sst/sst5_phrases_train.jsonl.gz": "sent_train",
              "sst/sst5_dev.jsonl.gz": "sent_dev", "sst/sst5_test.jsonl.gz": "sent_test"}
    for rel, key in layout.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        if key is None:  # SICK in its staged field names
            rows = [json.loads(r) for r in files["nli_train"].read_text().splitlines()][:12]
            text = "".join(json.dumps({"sentence_a": r["sentence1"], "sentence_b": r["sentence2"],
                                       "entailment": r["gold_label"]}) + "\n" for r in rows)
            (root / rel).write_bytes(gzip.compress(text.encode()))
        else:
            with files[key].open("rb") as src, gzip.open(root / rel, "wb") as dst:
                shutil.copyfileobj(src, dst)
    common = ["--data", root, "--glove", files["glove"], "--epochs", "1", *TINY]
    # the fake SST has 2 labels, so it needs 2 label names instead of the recipe's 5
    assert run_cli("--recipe", "sst5", "--out", tmp_path / "sst5", "--label-names", "neg,pos", *common) == 0
    assert run_cli("--recipe", "nli", "--out", tmp_path / "nli", "--holdout", "6", *common) == 0
    assert Vocab.load(tmp_path / "sst5" / "vocab.json") == Vocab.load(tmp_path / "nli" / "vocab.json")
    best = load_checkpoint(tmp_path / "nli" / "best.pt")
    assert best["metrics"]["sizes"] == {"train": 48 + 12 + 24 - 6, "dev": 6, "test": 24}
    assert best["train_config"]["holdout_from"].endswith("snli/dev.jsonl.gz")


def test_collate_builds_ids_and_masks() -> None:
    vocab = Vocab(["a", "dog", "runs", "cat"])
    ex = [Example((("a", "dog", "runs"), ("a", "cat")), "neutral", "x:1"),
          Example((("dog",), ("a", "cat", "runs", "zebra")), "entailment", "x:2")]
    enc = encode_dataset(make_dataset("nli", ex, NLI_LABELS), vocab, max_len=3)
    (p, pm, h, hm), y = collate(enc, [0, 1])
    assert p.shape == (2, 3) and h.shape == (2, 3)  # hypothesis 2 cut to max_len
    assert pm.tolist() == [[True] * 3, [True, False, False]] and y.tolist() == [1, 0]
    assert enc.lengths.tolist() == [3, 3]


def test_resolve_device(monkeypatch) -> None:
    """auto picks the GPU only where PyTorch has one; an explicit choice is kept."""
    from disan.train import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("cuda:1") == torch.device("cuda:1")


def test_ema_is_what_dev_selects_and_best_pt_holds_and_resume_keeps_it(files, tmp_path: Path) -> None:
    common = ["--task", "nli", "--train", files["nli_train"], "--dev", files["nli_dev"], "--init", "random",
              "--embed-dim", "8", "--glove-extra", "0", "--eval-every", "0", "--ema", "0.5", *TINY[:-2]]
    assert run_cli(*common, "--epochs", "1", "--out", tmp_path / "one") == 0
    best, last = load_checkpoint(tmp_path / "one" / "best.pt"), load_checkpoint(tmp_path / "one" / "last.pt")
    average = {k.removeprefix("module."): v for k, v in last["ema_state"].items() if k.startswith("module.")}
    moved = [k for k, v in last["model_state"].items() if v.is_floating_point()
             and not torch.equal(v, average[k])]
    assert moved  # the average is not the raw weights ...
    for key, value in best["model_state"].items():  # ... and the one evaluated epoch's best.pt is it
        assert torch.equal(value, average[key]), key
    assert run_cli(*common, "--epochs", "2", "--out", tmp_path / "straight") == 0
    assert run_cli("--resume", tmp_path / "one" / "last.pt", "--epochs", "2", "--no-progress") == 0
    a, b = load_checkpoint(tmp_path / "straight" / "last.pt"), load_checkpoint(tmp_path / "one" / "last.pt")
    for key, value in a["ema_state"].items():
        assert torch.equal(value, b["ema_state"][key]), key


def test_ema_warms_up_like_tensorflow() -> None:
    from disan.train import ema_with_warmup

    update = ema_with_warmup(0.999)
    avg, cur = [torch.zeros(2)], [torch.ones(2)]
    update(avg, cur, 1)  # decay min(0.999, 2/11): the average moves most of the way at first
    assert torch.allclose(avg[0], torch.full((2,), 9 / 11))
    late = [torch.zeros(2)]
    update(late, cur, 100_000)  # then the decay is the one asked for
    assert torch.allclose(late[0], torch.full((2,), 0.001))


@pytest.mark.parametrize("decay", ["1", "-0.5"])
def test_an_ema_decay_outside_0_1_is_a_one_line_error(files, tmp_path: Path, capsys,
                                                       decay: str) -> None:
    rc = run_cli("--task", "nli", "--train", files["nli_train"], "--dev", files["nli_dev"],
                 "--init", "random", "--ema", decay, "--out", tmp_path / "run", *TINY)
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"--ema {float(decay)}" in err
    assert not (tmp_path / "run").exists()  # refused before any training


def test_distillation_loss_is_zero_at_the_teacher_and_scaled_by_t_squared() -> None:
    from disan.train import distillation_loss

    teacher = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    assert distillation_loss(teacher.clone(), teacher, 2.0).abs() < 1e-6
    student = torch.zeros(2, 3)
    p = torch.softmax(teacher / 3.0, -1)
    kl = (p * (p.log() - torch.log_softmax(student / 3.0, -1))).sum()
    assert torch.allclose(distillation_loss(student, teacher, 3.0), 9.0 * kl)


def test_soft_targets_teach_what_the_teacher_says_not_the_gold_label() -> None:
    """With --kd-weight 1 the student learns the teacher's labels; here the teacher says the
    opposite of the gold label for every example, so a trainer that ignored it would learn gold."""
    gen = np.random.default_rng(0)
    ids = [(gen.integers(2, 30, size=gen.integers(1, 9)).astype(np.int64),) for _ in range(32)]
    gold = gen.integers(0, 2, size=32)
    data = EncodedDataset("sentiment", ids, gold, soft=np.where(np.eye(3)[1 - gold] > 0, 6.0, -6.0)
                          .astype(np.float32))
    model = tiny_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(150):
        train_step(model, opt, data, np.arange(32), torch.device("cpu"), 10**6, kd_weight=1.0)
    model.eval()
    inputs, y = collate(data, np.arange(32))
    assert (model(*inputs).argmax(-1).numpy() == 1 - gold).all()


def test_rows_without_teacher_logits_learn_from_their_gold_label() -> None:
    """NaN logits are "no opinion": with --kd-weight 1 those rows still learn their gold labels,
    while the taught rows follow the teacher (here the opposite of gold)."""
    gen = np.random.default_rng(1)
    ids = [(gen.integers(2, 30, size=gen.integers(1, 9)).astype(np.int64),) for _ in range(32)]
    gold = gen.integers(0, 2, size=32)
    soft = np.where(np.eye(3)[1 - gold] > 0, 6.0, -6.0).astype(np.float32)
    soft[16:] = np.nan
    data = EncodedDataset("sentiment", ids, gold, soft=soft)
    model = tiny_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(200):
        loss, _ = train_step(model, opt, data, np.arange(32), torch.device("cpu"), 10**6, kd_weight=1.0)
        assert np.isfinite(loss)
    model.eval()
    inputs, _ = collate(data, np.arange(32))
    pred = model(*inputs).argmax(-1).numpy()
    assert (pred[:16] == 1 - gold[:16]).all() and (pred[16:] == gold[16:]).all()


def _soft_file(path: Path, texts: list[str], logits: np.ndarray, labels=("0", "1")) -> Path:
    from disan.task_teacher import example_key
    from disan.text import tokenize

    np.savez(path, keys=np.asarray([example_key(tuple(tokenize(t))) for t in texts]), logits=logits,
             labels=np.asarray(labels))
    return path


def test_cli_trains_with_soft_targets_and_refuses_a_file_that_misses_examples(files, tmp_path: Path,
                                                                             capsys) -> None:
    texts = [json.loads(r)["text"] for r in files["sent_train"].read_text().splitlines()]
    labels = [json.loads(r)["label"] for r in files["sent_train"].read_text().splitlines()]
    # the teacher's columns in another order than the training labels: mapped by name
    logits = np.asarray([[0.0, 3.0] if lab == 0 else [3.0, 0.0] for lab in labels], dtype=np.float32)
    soft = _soft_file(tmp_path / "soft.npz", texts, logits, labels=("1", "0"))
    common = ["--task", "sentiment", "--train", files["sent_train"], "--dev", files["sent_dev"],
              "--glove", files["glove"], "--epochs", "1", *TINY]
    assert run_cli(*common, "--soft-targets", soft, "--kd-weight", "0.7", "--kd-temperature", "2",
                   "--out", tmp_path / "kd") == 0
    cfg = load_checkpoint(tmp_path / "kd" / "best.pt")["train_config"]
    assert (cfg["soft_targets"], cfg["kd_weight"], cfg["kd_temperature"]) == (str(soft), 0.7, 2.0)
    capsys.readouterr()

    short = _soft_file(tmp_path / "short.npz", texts[:-1], logits[:-1])
    assert run_cli(*common, "--soft-targets", short, "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no teacher logits for 1 of 48 training examples" in err
    wrong = _soft_file(tmp_path / "wrong.npz", texts, logits, labels=("0", "2"))
    assert run_cli(*common, "--soft-targets", wrong, "--out", tmp_path / "o") == 2
    assert "are not the training labels" in capsys.readouterr().err
    assert run_cli(*common, "--soft-targets", tmp_path / "none.npz", "--out", tmp_path / "o") == 2
    assert "not a soft-target file" in capsys.readouterr().err
    assert run_cli(*common, "--soft-targets", soft, "--kd-weight", "1.5", "--out", tmp_path / "o") == 2
    assert "--kd-weight 1.5" in capsys.readouterr().err


def test_examples_without_a_gold_label_learn_from_the_teacher_alone() -> None:
    """`--augmented` rows (label id -1) follow the teacher whatever --kd-weight is (here 0: the
    gold rows learn from their labels alone), and training accuracy counts the gold rows only. A
    trainer that took -1 for a class fails: cross-entropy refuses the label."""
    gen = np.random.default_rng(2)
    ids = [(gen.integers(2, 30, size=gen.integers(3, 9)).astype(np.int64),) for _ in range(32)]
    gold = gen.integers(0, 2, size=32)
    taught = gen.integers(0, 3, size=16)  # the teacher's class of each example without a label
    soft = np.full((32, 3), np.nan, dtype=np.float32)
    soft[16:] = np.where(np.eye(3)[taught] > 0, 6.0, -6.0)
    labels = gold.copy()
    labels[16:] = -1
    data = EncodedDataset("sentiment", ids, labels, soft=soft)
    model = tiny_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(200):
        loss, correct = train_step(model, opt, data, np.arange(32), torch.device("cpu"), 10**6,
                                   kd_weight=0.0)
        assert np.isfinite(loss) and correct <= 16
    model.eval()
    inputs, _ = collate(data, np.arange(32))
    pred = model(*inputs).argmax(-1).numpy()
    assert (pred[:16] == gold[:16]).all() and (pred[16:] == taught).all()


def test_cli_adds_the_teacher_labelled_examples_and_refuses_a_bad_file(files, tmp_path: Path,
                                                                       capsys) -> None:
    rng = random.Random(5)
    texts = [sentence(rng, i % 2 == 1) + " cat" for i in range(10)]
    logits = np.asarray([[0.0, 4.0] if i % 2 else [4.0, 0.0] for i in range(10)], dtype=np.float32)
    augmented = _soft_file(tmp_path / "augmented.npz", texts, logits)
    common = ["--task", "sentiment", "--train", files["sent_train"], "--dev", files["sent_dev"],
              "--glove", files["glove"], "--epochs", "1", *TINY]
    assert run_cli(*common, "--augmented", augmented, "--out", tmp_path / "aug") == 0
    ckpt = load_checkpoint(tmp_path / "aug" / "best.pt")
    assert ckpt["train_config"]["augmented"] == str(augmented)
    assert ckpt["sizes"]["train"] == 48 + 10
    history = [json.loads(r) for r in (tmp_path / "aug" / "metrics.jsonl").read_text().splitlines()]
    assert all(0.0 <= r["train_acc"] <= 1.0 for r in history if "train_acc" in r)
    capsys.readouterr()

    wrong = _soft_file(tmp_path / "wrong.npz", texts, logits, labels=("0", "2"))
    assert run_cli(*common, "--augmented", wrong, "--out", tmp_path / "o") == 2
    assert "are not the training labels" in capsys.readouterr().err
    assert run_cli(*common, "--augmented", tmp_path / "none.npz", "--out", tmp_path / "o") == 2
    assert "not a teacher-labelled example file" in capsys.readouterr().err
    skew = tmp_path / "skew.npz"
    np.savez(skew, keys=np.asarray(["a cat"]), logits=np.zeros((2, 2), np.float32),
             labels=np.asarray(["0", "1"]))
    assert run_cli(*common, "--augmented", skew, "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "logits of shape (2, 2) for 1 keys" in err
    nli = ["--task", "nli", "--train", files["nli_train"], "--dev", files["nli_dev"],
           "--glove", files["glove"], "--epochs", "1", *TINY]
    assert run_cli(*nli, "--augmented", augmented, "--out", tmp_path / "o") == 2
    assert "only sentiment tasks" in capsys.readouterr().err
