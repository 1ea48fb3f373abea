"""research.pieces_from_words: a piece student started from a word student reads a text of whole
words as the word student reads it, in the turned teacher's coordinates."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from conftest import loaded, make_tiny_checkpoint  # noqa: E402

from disan.model import DiSANConfig, DiSANEncoder  # noqa: E402
from disan.text.pieces import PieceTokenizer  # noqa: E402
from disan.text.tokenizer import Vocab  # noqa: E402
from disan.train.checkpoint import load_checkpoint  # noqa: E402
from research.pieces_from_words import graft  # noqa: E402

WORDS = "river storm farmer cattle council shelter road water kernel module driver memory".split()


def _tokenizer() -> PieceTokenizer:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    texts = [" ".join(WORDS)] * 50 + ["riverbank stormwater unmapped"]
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=90, special_tokens=["[UNK]"]))
    return PieceTokenizer(tok)


def test_whole_words_read_as_the_word_student_reads_them(tmp_path) -> None:
    vocab = Vocab(["<pad>", "<unk>", *WORDS])
    path = make_tiny_checkpoint(tmp_path / "words.pt", "encoder", vocab, [], seed=3, proj_dim=12)
    words_model, _ = loaded(path)
    tok = _tokenizer()
    text = "river storm farmer council"
    assert len(tok.batch_ids([text])[0]) == 4  # each a whole-word piece, so the rows are the words'
    start = np.random.default_rng(0).normal(size=(len(tok), 5)).astype(np.float32)
    axes = np.linalg.qr(np.random.default_rng(1).normal(size=(12, 12)))[0].astype(np.float32)

    made, direct = graft(load_checkpoint(path), tok, start, axes)
    pieces = DiSANEncoder(DiSANConfig.from_dict(made["config"])).eval()
    pieces.load_state_dict(made["model_state"])
    with torch.no_grad():
        ids = torch.tensor(tok.batch_ids([text]))
        got = pieces(ids, ids != 0).numpy()
        want_ids = torch.tensor([vocab.ids(text.split())])
        want = words_model(want_ids, want_ids != 0).numpy()
    assert direct >= len(WORDS)
    np.testing.assert_allclose(got, want @ axes.T, atol=1e-5)

    table = made["model_state"]["embed.weight"].numpy()
    split = [i for i in tok.batch_ids(["stormwater"])[0] if i not in tok.batch_ids([" ".join(WORDS)])[0]]
    assert split and np.isfinite(table[split]).all() and np.abs(table[split]).sum() > 0
    assert not table[0].any()  # padding stays zero


def test_bad_inputs_are_one_line_errors(tmp_path, capsys) -> None:
    from research.pieces_from_words import main

    vocab = Vocab(["<pad>", "<unk>", *WORDS])
    words = make_tiny_checkpoint(tmp_path / "words.pt", "encoder", vocab, [], seed=3, proj_dim=12)
    tok_file = tmp_path / "tokenizer.json"
    tok = _tokenizer()
    tok.save(tok_file)
    np.save(tmp_path / "short.npy", np.zeros((3, 5), np.float32))
    short = ["--pieces", str(tmp_path / "short.npy")]
    base = ["--tokenizer", str(tok_file), "--corpus", str(tmp_path), "--out", str(tmp_path / "o.pt"),
            "--no-rotate", *short]
    for args, says in ((["--words", str(tmp_path / "none.pt")], "checkpoint not found"),
                       (["--words", str(words)], "the tokenizer has")):
        with pytest.raises(SystemExit) as exit_info:
            main(args + base)
        assert exit_info.value.code == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "o.pt").exists()


def test_turned_back_serves_the_teachers_own_coordinates(tmp_path) -> None:
    """research.turn_back: the vectors turned back by the axes (the same cosines); no Matryoshka
    sizes are claimed for them; a student of the unturned teacher is refused."""
    from research.turn_back import turned_back

    path = make_tiny_checkpoint(tmp_path / "s.pt", "encoder", Vocab(["<pad>", "<unk>", *WORDS]), [], seed=3,
                                proj_dim=12)
    payload = load_checkpoint(path) | {"train_config": {"rotate_teacher": True}, "matryoshka_dims": [12, 6]}
    axes = np.linalg.qr(np.random.default_rng(1).normal(size=(12, 12)))[0].astype(np.float32)
    back = turned_back(payload, axes)
    before, after = (DiSANEncoder(DiSANConfig.from_dict(p["config"])).eval() for p in (payload, back))
    before.load_state_dict(payload["model_state"])
    after.load_state_dict(back["model_state"])
    ids = torch.tensor([[2, 3, 4, 5], [6, 7, 0, 0]])
    with torch.no_grad():
        want = before(ids, ids != 0).numpy() @ axes
        np.testing.assert_allclose(after(ids, ids != 0).numpy(), want, atol=1e-5)
    assert "matryoshka_dims" not in back and back["train_config"]["rotate_teacher"] is False
    with pytest.raises(ValueError, match="turned teacher"):
        turned_back(back, axes)
