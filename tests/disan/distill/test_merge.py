"""disan merge: a phase's change less a control phase's, added to the start (tiny encoders)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from disan import cli  # noqa: E402
from disan.distill import merge  # noqa: E402
from disan.model import DiSANConfig, DiSANEncoder  # noqa: E402
from disan.text.tokenizer import Vocab  # noqa: E402
from disan.train.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402

WORDS = "the cat sat on a mat".split()


def _student(path: Path, seed: int, words=WORDS, d_h: int = 4) -> dict:
    torch.manual_seed(seed)
    vocab = Vocab(words)
    cfg = DiSANConfig(vocab_size=len(vocab), embed_dim=6, d_h=d_h, task="encoder", proj_dim=5)
    encoder = DiSANEncoder(cfg)
    save_checkpoint(path, encoder, vocab, [], train_config={"lr": 1e-3},
                    metrics={"stsb": 0.5}, step=7, epoch=1)
    return load_checkpoint(path)["model_state"]


def test_adds_the_phase_change_less_the_control_change(tmp_path: Path) -> None:
    start, phase, control = (_student(tmp_path / f"{n}.pt", s) for n, s in (("s", 0), ("p", 1), ("c", 2)))
    record = merge.merge(tmp_path / "s.pt", tmp_path / "p.pt", tmp_path / "m.pt", tmp_path / "c.pt",
                         scale=0.5)
    merged = load_checkpoint(tmp_path / "m.pt")
    for key, value in start.items():
        if value.is_floating_point():
            torch.testing.assert_close(merged["model_state"][key], value + 0.5 * (phase[key] - control[key]))
    assert record["scale"] == 0.5 and record["control"]["file"] == "c.pt"
    assert len(record["phase"]["sha256"]) == 64
    assert merged["merge"] == record and "train_config" not in merged
    # The start's as-trained record does not describe the merged weights.
    assert not {"metrics", "step", "epoch"} & merged.keys()
    # The result loads as an encoder of the start's shape.
    DiSANEncoder(DiSANConfig.from_dict(merged["config"])).load_state_dict(merged["model_state"])


def test_without_a_control_it_interpolates_and_can_keep_the_word_table(tmp_path: Path) -> None:
    start, phase = _student(tmp_path / "s.pt", 0), _student(tmp_path / "p.pt", 1)
    merge.merge(tmp_path / "s.pt", tmp_path / "p.pt", tmp_path / "m.pt", scale=0.25, keep_words=True)
    merged = load_checkpoint(tmp_path / "m.pt")["model_state"]
    assert torch.equal(merged[merge.WORD_TABLE], start[merge.WORD_TABLE])
    key = "proj.weight"
    torch.testing.assert_close(merged[key], 0.75 * start[key] + 0.25 * phase[key])


def test_refuses_other_shapes_vocabularies_and_overwriting_an_input(tmp_path: Path) -> None:
    _student(tmp_path / "s.pt", 0)
    _student(tmp_path / "wide.pt", 1, d_h=6)
    _student(tmp_path / "words.pt", 1, words=[*WORDS[:-1], "rug"])
    with pytest.raises(ValueError, match="another model shape"):
        merge.merge(tmp_path / "s.pt", tmp_path / "wide.pt", tmp_path / "m.pt")
    with pytest.raises(ValueError, match="another vocabulary"):
        merge.merge(tmp_path / "s.pt", tmp_path / "words.pt", tmp_path / "m.pt")
    with pytest.raises(ValueError, match="one of the inputs"):
        merge.merge(tmp_path / "s.pt", tmp_path / "words.pt", tmp_path / "s.pt")


def test_cli_refuses_a_scale_out_of_range(tmp_path: Path, capsys) -> None:
    _student(tmp_path / "s.pt", 0)
    _student(tmp_path / "p.pt", 1)
    assert cli.main(["distill", "merge", str(tmp_path / "s.pt"), str(tmp_path / "p.pt"), "--scale", "0",
                     "--out", str(tmp_path / "m.pt")]) != 0
    assert "--scale must be in (0, 4]" in capsys.readouterr().err
    assert not (tmp_path / "m.pt").exists()


def test_several_phases_are_averaged_and_all_named(tmp_path: Path, capsys) -> None:
    """Seeds of one phase merge as their mean (a uniform soup), not as the first or last one."""
    start = _student(tmp_path / "s.pt", 0)
    seeds = [_student(tmp_path / f"p{i}.pt", i + 1) for i in range(3)]
    paths = [tmp_path / f"p{i}.pt" for i in range(3)]
    record = merge.merge(tmp_path / "s.pt", paths, tmp_path / "m.pt", keep_words=True)
    merged = load_checkpoint(tmp_path / "m.pt")["model_state"]
    key = "proj.weight"
    torch.testing.assert_close(merged[key], sum(s[key] for s in seeds) / 3)
    assert torch.equal(merged[merge.WORD_TABLE], start[merge.WORD_TABLE])
    assert [r["file"] for r in record["phase"]] == ["p0.pt", "p1.pt", "p2.pt"]
    with pytest.raises(ValueError, match="at least one phase"):
        merge.merge(tmp_path / "s.pt", [], tmp_path / "e.pt")
    # The command line takes them the same way and says it averaged.
    assert cli.main(["distill", "merge", str(tmp_path / "s.pt"), *map(str, paths), "--keep-words",
                     "--out", str(tmp_path / "c.pt")]) == 0
    assert "mean(" in capsys.readouterr().out
    torch.testing.assert_close(load_checkpoint(tmp_path / "c.pt")["model_state"][key], merged[key])
