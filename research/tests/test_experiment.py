"""`disan experiment`: a tiny grid on tiny synthetic data runs, records, resumes exactly, tabulates."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)  # tiny tensors: threads only add overhead on a shared CPU

from grid_specs import GRID_ROWS, write_grid_spec  # noqa: E402

import disan.cli  # noqa: E402
import disan.train.loop  # noqa: E402
from research import experiment as X  # noqa: E402
from research import experiment_spec as S  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
POS = "good great fine wonderful funny moving".split()
NEG = "bad awful boring terrible dull worst".split()
FILL = "the movie film plot is was very really quite".split()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Sentiment jsonl splits (2 labels) and a tiny 8-d GloVe text file in one data root."""
    root = tmp_path_factory.mktemp("data")
    rng = random.Random(0)
    for split, n in (("train", 48), ("dev", 24), ("test", 24)):
        rows = []
        for i in range(n):
            words = [rng.choice(FILL) for _ in range(rng.randint(1, 5))]
            words.insert(rng.randint(0, len(words)), rng.choice(POS if i % 2 else NEG))
            rows.append(json.dumps({"text": " ".join(words), "label": i % 2}) + "\n")
        (root / f"{split}.jsonl").write_text("".join(rows))
    (root / "glove.txt").write_text("".join(
        w + " " + " ".join(f"{rng.uniform(-1, 1):.4f}" for _ in range(8)) + "\n"
        for w in ["the", "good", "bad", "movie", "cat", "dog"]))
    return root


def runner(spec_path: Path, data: Path, tmp_path: Path) -> X.Runner:
    spec = S.load_spec(spec_path, S.train_fields())
    return X.Runner(spec, tmp_path / "runs", data, log=io.StringIO())


def test_grid_runs_every_pair_seed_major_then_skips_finished_runs(data, tmp_path, monkeypatch) -> None:
    r = runner(write_grid_spec(tmp_path / "grid.toml", data, GRID_ROWS), data, tmp_path)
    assert r.run() == 0
    rows = X.read_results(r.results_path)
    assert r.results_path == tmp_path / "results" / "tiny.jsonl"
    assert [(x["row"], x["seed"]) for x in rows] == [("disan", 1), ("diag", 1), ("disan", 2), ("diag", 2)]
    for x in rows:
        assert x["steps"] == 6 and x["stop_reason"] == "epochs" and 0 <= x["test_acc"] <= 1
        assert x["sizes"] == {"train": 48, "dev": 24, "test": 24}
        assert [c[0] for c in x["curve"]] == [2, 3, 4, 6]  # every 2 steps and each epoch's end
        assert x["dev_acc"] == max(c[2] for c in x["curve"]) or abs(
            x["dev_acc"] - max(c[2] for c in x["curve"])) < 1e-5
        assert x["train_config"]["seed"] == x["seed"] and x["model_config"]["d_h"] == 8
        assert x["git"]["commit"] is None or len(x["git"]["commit"]) == 40
    assert {x["model_config"]["mask_kind"] for x in rows} == {"directional", "diag"}
    text = r.results_path.read_text()
    table_md = (tmp_path / "results" / "tiny.md").read_text()  # rewritten after every run
    assert "| disan | (none) | 51.72 |" in table_md and "| 2/2 (1,2) | 6 |" in table_md
    assert (tmp_path / "results" / "tiny_dev_curves.png").is_file()
    assert str(tmp_path) not in text and "<data>/train.jsonl" in text  # no machine paths recorded

    def must_not_train(argv):
        raise AssertionError(f"re-ran a finished run: {argv}")
    monkeypatch.setattr(disan.cli, "main", must_not_train)
    assert r.run() == 0 and r.results_path.read_text() == text
    assert "4/4 runs finished; 0 to run" in r.log.getvalue()


def test_interrupted_run_resumes_from_last_pt_exactly(data, tmp_path, monkeypatch) -> None:
    """Rows `a` and `b` train the same config; `a` is interrupted mid-run and resumed: same result."""
    rows = '[[rows]]\nname = "a"\n[[rows]]\nname = "b"\n'
    spec = write_grid_spec(tmp_path / "grid.toml", data, rows, seeds=(3,))
    calls, argvs = {"plots": 0}, []
    real_plot, real_main = disan.train.loop.plot_curves, disan.cli.main

    def plot_then_interrupt(*a, **k):
        calls["plots"] += 1
        if calls["plots"] == 2:  # after the 2nd evaluation's last.pt is written
            raise KeyboardInterrupt
        return real_plot(*a, **k)

    def recording_main(argv):
        argvs.append(argv)
        return real_main(argv)

    monkeypatch.setattr(disan.train.loop, "plot_curves", plot_then_interrupt)
    monkeypatch.setattr(disan.cli, "main", recording_main)
    r = runner(spec, data, tmp_path)
    assert r.run() == 130
    assert X.read_results(r.results_path) == [] and "run the same command again" in r.log.getvalue()
    monkeypatch.setattr(disan.train.loop, "plot_curves", real_plot)
    assert r.run() == 0
    assert "--resume" in argvs[1] and "--resume" not in argvs[2]
    a, b = X.read_results(r.results_path)
    assert (a["row"], b["row"]) == ("a", "b") and a["key"] == b["key"]
    for key in ("dev_acc", "test_acc", "best_step", "steps", "test_macro_f1"):
        assert a[key] == b[key], key
    assert [c[2] for c in a["curve"]] == [c[2] for c in b["curve"]]


def test_plan_runs_stage_by_stage_seed_major(tmp_path) -> None:
    rows = GRID_ROWS + '[[rows]]\nname = "slow"\nstage = 2\ntrain = { attention_kind = "coda" }\n'
    spec = S.load_spec(write_grid_spec(tmp_path / "grid.toml", tmp_path, rows), S.train_fields())
    todo, done = X.Runner(spec, tmp_path / "runs", tmp_path).plan()
    assert done == 0 and [(r.name, s) for r, s in todo] == [
        ("disan", 1), ("diag", 1), ("disan", 2), ("diag", 2), ("slow", 1), ("slow", 2)]


@pytest.mark.parametrize("spec_path", sorted((REPO / "research" / "experiments").glob("*.toml")),
                         ids=lambda p: p.name)
def test_shipped_specs_are_valid_disan_train_commands(tmp_path, spec_path: Path) -> None:
    """Every row of every shipped grid spec parses as `disan train` flags (choices included) and
    resolves to a TrainConfig holding the row's options, without training anything."""
    import argparse

    from disan.train import cli as train_cli

    spec = S.load_spec(spec_path, S.train_fields())
    runner = X.Runner(spec, tmp_path / "runs", tmp_path, log=io.StringIO())
    keys = set()
    for row in spec.rows:
        parser = argparse.ArgumentParser()
        train_cli.add_arguments(parser)
        args = parser.parse_args(runner.argv(row, spec.seeds[0]))
        cfg = train_cli.config_from_args(args)
        for key, value in S.row_options(spec, row).items():
            assert getattr(cfg, key) == value, (row.name, key)
        keys.add(S.row_key(spec, row))
    assert len(keys) == len(spec.rows)
