"""`disan experiment --table`: mean ± std per row over finished seeds, what is missing, dev curves."""

from __future__ import annotations

from grid_specs import GRID_ROWS, write_grid_spec

import research.cli
from research import experiment_spec as S
from research import experiment_table as T


def test_table_shows_mean_std_per_row_and_what_is_missing(tmp_path) -> None:
    spec = S.load_spec(write_grid_spec(tmp_path / "grid.toml", tmp_path, GRID_ROWS, seeds=(1, 2, 3)))
    key = S.row_key(spec, spec.rows[0])
    results = [{"row": "disan", "seed": s, "key": key, "test_acc": t, "dev_acc": d, "steps": 100,
                "train_s": 60.0, "curve": [[50, 30.0, d - 0.1], [100, 60.0, d]]}
               for s, t, d in ((1, 0.5, 0.4), (2, 0.6, 0.5), (3, 0.7, 0.6))]
    results.append({**results[0], "key": "stale", "test_acc": 0.99})  # another config: not counted
    text = T.table(spec, results)
    assert "| disan | (none) | 51.72 | 60.00 ± 10.00 | 50.00 ± 10.00 | 3/3 (1,2,3) | 100 | 1.0 |" in text
    assert "| diag | `--mask-kind diag` | - | not yet measured | not yet measured | 0/3 | - | - |" in text
    assert "--mask-kind diag --seed $s" in text
    assert T.plot(spec, results, tmp_path / "curves.png") and (tmp_path / "curves.png").stat().st_size > 0
    assert T.mean_std([0.5]) == "50.00"


def test_cli_table_mode_writes_markdown(tmp_path, capsys) -> None:
    spec = write_grid_spec(tmp_path / "grid.toml", tmp_path, GRID_ROWS)
    assert research.cli.main(["experiment", str(spec), "--table"]) == 0
    assert "not yet measured" in capsys.readouterr().out
    assert (tmp_path / "results" / "tiny.md").read_text().startswith("# tiny")
