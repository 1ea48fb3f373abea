"""Training: optimizer groups, frozen rows, overfitting, the `disan train` CLI end to end, resume."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)  # tiny tensors: threads only add overhead on a shared CPU

from disan.bundle.manifest import NLI_LABELS  # noqa: E402
from disan.cli import main  # noqa: E402
from disan.data.readers import EncodedDataset, Example, encode_dataset, make_dataset  # noqa: E402
from disan.model import DiSANConfig, build_model  # noqa: E402
from disan.text.tokenizer import Vocab  # noqa: E402
from disan.train.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from disan.train.config import TrainConfig  # noqa: E402
from disan.train.loop import collate, make_optimizer, train_step  # noqa: E402

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
    return write_files(tmp_path_factory.mktemp("data"))


def write_files(root: Path) -> dict[str, Path]:
    """Generated sentiment + NLI jsonl splits and a tiny 8-d GloVe text file under `root`."""
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
    from disan.train.loop import collate
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


def test_members_trained_over_a_frozen_table_join_an_ensemble(files, tmp_path: Path, capsys) -> None:
    """--init-words copies the table alone (the attention blocks start fresh), --freeze-words keeps
    it bit for bit, and `python -m research ensemble` accepts the result as a member of the first model."""
    from research.cli import main as research_main  # `python -m research ensemble` (from a checkout)

    common = ["--task", "sentiment", "--train", files["sent_train"], "--dev", files["sent_dev"],
              "--glove", files["glove"], "--epochs", "1", "--label-names", "negative,positive", *TINY]
    assert run_cli(*common, "--out", tmp_path / "first") == 0
    first = tmp_path / "first" / "best.pt"
    assert run_cli(*common, "--vocab", tmp_path / "first" / "vocab.json", "--init-words", first,
                   "--freeze-words", "--seed", "7", "--out", tmp_path / "member") == 0
    a = load_checkpoint(first)["model_state"]
    b = load_checkpoint(tmp_path / "member" / "best.pt")["model_state"]
    assert torch.equal(a["encoder.embed.weight"], b["encoder.embed.weight"])
    assert not b["encoder.trainable_rows"].any()
    assert not torch.equal(a["encoder.fw.map.linear.weight"], b["encoder.fw.map.linear.weight"])
    assert research_main(["ensemble", str(first), str(tmp_path / "member" / "best.pt"),
                 "--out", str(tmp_path / "ens.pt")]) == 0
    # without --freeze-words the member's table moves and it cannot share the first one's
    assert run_cli(*common, "--vocab", tmp_path / "first" / "vocab.json", "--init-words", first,
                   "--seed", "7", "--out", tmp_path / "free") == 0
    free = tmp_path / "free" / "best.pt"
    assert research_main(["ensemble", str(first), str(free), "--out", str(tmp_path / "x.pt")]) == 2
    assert "not the first model's" in capsys.readouterr().err and not (tmp_path / "x.pt").exists()


def test_a_python_without_matplotlib_trains_and_skips_only_the_figure(files, tmp_path: Path) -> None:
    """A lent GPU's Python has no matplotlib and nothing can be installed there; `disan train` ran
    its SST-5 lease steps only once the figure, which redraws metrics.jsonl, became optional."""
    out = tmp_path / "run"
    args = ["train", "--task", "sentiment", "--train", files["sent_train"], "--dev", files["sent_dev"],
            "--glove", files["glove"], "--epochs", "1", "--eval-every", "2", "--out", out, *TINY]
    code = ("import sys; sys.modules['matplotlib'] = None\n"  # as if not installed
            "from disan.cli import main\n"
            f"raise SystemExit(main({[str(a) for a in args]!r}))")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                         cwd=Path(__file__).resolve().parents[3])
    assert got.returncode == 0, got.stderr[-2000:]
    assert (out / "best.pt").is_file() and (out / "metrics.jsonl").is_file()
    assert not (out / "curves.png").exists()


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


def test_lr_decay_falls_to_zero_over_the_epochs_and_a_resume_stays_on_the_curve(
        files, tmp_path: Path, monkeypatch) -> None:
    import disan.train.loop as T

    rates: list[float] = []
    step = T.train_step

    def recording_step(model, optimizer, *args):
        rates.append(optimizer.param_groups[0]["lr"])
        return step(model, optimizer, *args)

    monkeypatch.setattr(T, "train_step", recording_step)
    common = ["--task", "nli", "--train", files["nli_train"], "--dev", files["nli_dev"], "--init", "random",
              "--embed-dim", "8", "--glove-extra", "0", "--eval-every", "0", "--optimizer", "adam",
              "--lr", "0.01", "--lr-decay", "linear", "--epochs", "2", *TINY[:-2]]
    assert run_cli(*common, "--out", tmp_path / "straight") == 0
    assert rates == pytest.approx([0.01 * (1 - k / 6) for k in range(6)])  # 3 steps an epoch
    # stopped by the time budget after its first step, then resumed: the same weights at the end
    assert run_cli(*common, "--max-minutes", "1e-9", "--out", tmp_path / "split") == 0
    assert load_checkpoint(tmp_path / "split" / "last.pt")["step"] == 1
    assert run_cli("--resume", tmp_path / "split" / "last.pt", "--max-minutes", "60", "--no-progress") == 0
    a = load_checkpoint(tmp_path / "straight" / "last.pt")
    b = load_checkpoint(tmp_path / "split" / "last.pt")
    assert a["step"] == b["step"] == 6
    for key, value in a["model_state"].items():
        assert torch.equal(value, b["model_state"][key]), key


def test_a_resume_takes_a_knob_set_back_to_its_default(files, tmp_path: Path) -> None:
    # --max-minutes 0 means no budget: a run stopped by its budget must be able to go on without one
    common = ["--task", "nli", "--train", files["nli_train"], "--dev", files["nli_dev"], "--init", "random",
              "--embed-dim", "8", "--glove-extra", "0", "--eval-every", "0", "--epochs", "2", *TINY[:-2]]
    assert run_cli(*common, "--max-minutes", "1e-9", "--patience", "5", "--out", tmp_path / "run") == 0
    assert load_checkpoint(tmp_path / "run" / "last.pt")["step"] == 1
    assert run_cli("--resume", tmp_path / "run" / "last.pt", "--max-minutes", "0", "--patience", "10",
                   "--no-progress") == 0
    last = load_checkpoint(tmp_path / "run" / "last.pt")
    assert last["step"] == 6
    assert last["train_config"]["max_minutes"] == 0 and last["train_config"]["patience"] == 10


def test_a_resume_refuses_a_setting_it_cannot_change(files, tmp_path: Path, capsys) -> None:
    common = ["--task", "nli", "--train", files["nli_train"], "--dev", files["nli_dev"], "--init", "random",
              "--embed-dim", "8", "--glove-extra", "0", "--eval-every", "0", "--epochs", "1", *TINY[:-2]]
    assert run_cli(*common, "--out", tmp_path / "run") == 0
    before = (tmp_path / "run" / "last.pt").read_bytes()
    capsys.readouterr()
    assert run_cli("--resume", tmp_path / "run" / "last.pt", "--epochs", "2", "--lr-decay", "linear",
                   "--lr", "0.1", "--no-progress") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--lr, --lr-decay cannot change" in err
    assert (tmp_path / "run" / "last.pt").read_bytes() == before  # refused before any step


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
    from disan.train.loop import resolve_device

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
    from disan.train.loop import ema_with_warmup

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
