"""The tiny corpus, tokenizer and teacher cache the student tests train on (a module, not a second
conftest: only the student tests need it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from disan.distill.corpus import build as corpus
from disan.distill.corpus.documents import Doc
from disan.distill.corpus.sources import Source
from disan.distill.teacher import TeacherCache
from disan.text.pieces import PieceTokenizer

WORDS = ("river storm farmer cattle council shelter road water kernel module driver memory page "
         "cache disk file network packet server client query answer question title").split()


def _tokenizer(texts: list[str]) -> PieceTokenizer:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=120, special_tokens=["[UNK]"]))
    return PieceTokenizer(tok)


def _docs(n: int) -> list[Doc]:
    rng = np.random.default_rng(0)
    docs = []
    for i in range(n):
        words = rng.choice(WORDS, 40)
        sentences = [" ".join(words[j:j + 8]).capitalize() + "." for j in range(0, 40, 8)]
        docs.append(Doc([" ".join(sentences)], title=f"{words[0]} {words[1]} {i}", relation="heading"))
    return docs


@pytest.fixture(scope="module", name="tiny")
def tiny_fixture(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("student")
    docs = _docs(60)
    source = Source("t", "test", "CC0", lambda _root: iter(docs), staged=True)
    orig = corpus.eval_keys
    corpus.eval_keys = lambda _data: set()
    try:
        corpus.build([source], root, None, root / "corpus", passage_words=(10, 24))
    finally:
        corpus.eval_keys = orig
    texts, info = corpus.read_corpus(root / "corpus")
    cache = TeacherCache.open(root / "corpus" / "teacher-mpnet", info["sha256"], "mpnet", len(texts), 16)
    vectors = np.random.default_rng(1).normal(size=(len(texts), 16)).astype(np.float16)
    cache.write(0, vectors)
    tok = _tokenizer(texts)
    tok.save(root / "tokenizer.json")
    return root, root / "tokenizer.json"
