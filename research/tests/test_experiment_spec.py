"""Grid specs of `disan experiment`: every problem is one line naming it; shipped rows are distinct models."""

from __future__ import annotations

from pathlib import Path

import pytest
from grid_specs import write_grid_spec

import research.cli
from research import experiment_spec as S

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("rows", "message"), [
    ('[[rows]]\nname = "x"\ntrain = { no_such_option = 1 }\n', "not TrainConfig fields: ['no_such_option']"),
    ('[[rows]]\nname = "x"\ntrain = { seed = 1 }\n', "set by the runner"),
    ('[[rows]]\nname = "x/y"\n', "plain 'name'"),
    ('[[rows]]\nname = "x"\n[[rows]]\nname = "x"\n', "unique"),
    ("", "no [[rows]]"),
])
def test_bad_specs_give_a_one_line_error(tmp_path, capsys, rows: str, message: str) -> None:
    spec = write_grid_spec(tmp_path / "grid.toml", tmp_path, rows)
    assert research.cli.main(["experiment", str(spec), "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.count("\n") == 0


def test_shipped_ablation_rows_build_distinct_models() -> None:
    """Every row of research/experiments/sst5_ablation.toml reaches the model as its own architecture."""
    import numpy as np

    torch = pytest.importorskip("torch")
    import disan.train.loop  # torch

    spec = S.load_spec(REPO / "research" / "experiments" / "sst5_ablation.toml", S.train_fields())
    ids = torch.randint(2, 30, (3, 6))
    outputs, configs = {}, {}
    for row in spec.rows:
        opts = {k: v for k, v in S.row_options(spec, row).items()
                if k in ("mask_kind", "attention_kind", "coda_gate", "s2t_kind", "encoder_kind")}
        cfg = disan.train.loop.TrainConfig(task="sentiment", out="unused", d_h=8, seed=0, **opts)
        matrix = np.random.default_rng(0).normal(size=(30, 8)).astype(np.float32)
        model = disan.train.loop.new_model(cfg, 30, 8, 5, matrix, np.ones(30, dtype=bool)).eval()
        configs[row.name] = model.cfg
        for key, value in opts.items():
            assert getattr(model.cfg, key) == value, (row.name, key)
        with torch.no_grad():
            outputs[row.name] = model(ids, ids != 0)
    names = list(outputs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not torch.allclose(outputs[a], outputs[b]), (a, b)
    kinds = {(c.mask_kind, c.attention_kind, c.coda_gate, c.s2t_kind, c.encoder_kind)
             for c in configs.values()}
    assert len(kinds) == len(names) == 8
