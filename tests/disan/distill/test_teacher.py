"""Teacher cache: fp16 on disk, memory-mapped, resumable after a crash with no row lost or redone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support_files import write_corpus_folder

from disan.distill.teacher import TeacherCache, encode_corpus


def _vectors(texts: list[str]) -> np.ndarray:
    return np.array([[len(t), float(t.split()[-1]), 1.0] for t in texts], dtype=np.float32)


def test_resume_after_crash_encodes_each_row_once(tmp_path: Path) -> None:
    sentences = [f"sentence number {i}" for i in range(23)]
    cache = TeacherCache.open(tmp_path / "c", "abc", "fake", len(sentences), 3)
    seen: list[str] = []

    def crashing(texts: list[str]) -> np.ndarray:
        if len(seen) >= 10:
            raise KeyboardInterrupt  # killed while encoding the third chunk
        seen.extend(texts)
        return _vectors(texts)

    with pytest.raises(KeyboardInterrupt):
        encode_corpus(sentences, cache, crashing, chunk=5, log=lambda _m: None)
    assert cache.done == 10

    again = TeacherCache.open(tmp_path / "c", "abc", "fake", len(sentences), 3)
    redone: list[str] = []
    encode_corpus(sentences, again, lambda t: (redone.extend(t), _vectors(t))[1], chunk=5,
                  log=lambda _m: None)
    assert redone == sentences[10:]  # nothing encoded twice, nothing skipped
    got = again.vectors()
    assert got.dtype == np.float16 and isinstance(got, np.memmap)
    np.testing.assert_array_equal(got, _vectors(sentences).astype(np.float16))


def test_refuses_a_cache_of_another_corpus(tmp_path: Path) -> None:
    TeacherCache.open(tmp_path / "c", "abc", "fake", 4, 3)
    with pytest.raises(ValueError, match="another corpus"):
        TeacherCache.open(tmp_path / "c", "def", "fake", 4, 3)


def test_max_minutes_stops_after_a_chunk(tmp_path: Path) -> None:
    sentences = [f"row {i}" for i in range(12)]
    cache = TeacherCache.open(tmp_path / "c", "abc", "fake", len(sentences), 3)
    assert encode_corpus(sentences, cache, _vectors, chunk=4, max_minutes=0, log=lambda _m: None) == 4


class _RecordingModel:
    """Stands in for a sentence-transformer: records whether bf16 autocast was on."""

    def __init__(self) -> None:
        self.autocast: list[bool] = []

    def encode(self, texts, **_kw):
        import torch

        self.autocast.append(torch.is_autocast_enabled("cpu"))
        return np.ones((len(texts), 3), dtype=np.float32)


@pytest.mark.parametrize(("has_bf16", "faster", "precision", "want"), [
    (False, True, None, False),  # emulated bf16 is slower than fp32 there: the default must not pick it
    (True, True, None, True),
    # the flag without the speed (an Intel Xeon with AVX-512 BF16 and no AMX: MPNet 1.5x slower)
    (True, False, None, False),
    (True, False, "auto", False),
    (False, True, "auto", False),
    (False, False, "bf16", True),   # asked for explicitly
    (True, True, "fp32", False),
])
def test_cpu_autocast_only_where_bf16_is_native_and_faster(monkeypatch, has_bf16, faster, precision,
                                                           want) -> None:
    torch = pytest.importorskip("torch")
    from disan.distill import teacher
    from disan.train import word_vectors as embeddings

    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, name, lambda: has_bf16, raising=False)
    monkeypatch.setattr(teacher, "bf16_faster_on_cpu", lambda: faster)
    model = _RecordingModel()
    monkeypatch.setattr(embeddings, "_sentence_encoder", lambda name, device: model)
    kwargs = {} if precision is None else {"precision": precision}
    teacher.sentence_transformer_encoder("minilm", **kwargs)(["a b c"])
    assert model.autocast == [want]
    assert teacher.native_bf16("cuda:0")
    assert teacher.resolved_precision("cuda:0", "auto") == "bf16"  # no CPU timing on a GPU


def test_the_cpu_bf16_timing_is_a_cached_answer_that_draws_nothing_from_torch() -> None:
    torch = pytest.importorskip("torch")
    from disan.distill import teacher

    teacher.bf16_faster_on_cpu.cache_clear()
    torch.manual_seed(3)
    answer = teacher.bf16_faster_on_cpu()
    drawn = torch.rand(1)
    torch.manual_seed(3)
    assert torch.equal(torch.rand(1), drawn)  # a seeded fit draws the same with or without the timing
    assert isinstance(answer, bool)
    assert teacher.bf16_faster_on_cpu() is answer and teacher.bf16_faster_on_cpu.cache_info().hits >= 1


def _tiny_sentence_transformer(folder: Path) -> Path:
    """A 2-layer BERT sentence-transformer with a 12-word vocabulary, saved as a folder."""
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    try:  # sentence-transformers 6 moved the modules and deprecated the old path
        from sentence_transformers.sentence_transformer import modules
    except ImportError:
        from sentence_transformers import models as modules

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
             "a", "man", "plays", "the", "guitar", "dog", "runs"]
    (folder / "vocab").mkdir(parents=True)
    (folder / "vocab" / "vocab.txt").write_text("\n".join(words) + "\n")
    bert = folder / "bert"
    BertModel(BertConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(bert)
    BertTokenizerFast(vocab_file=str(folder / "vocab" / "vocab.txt")).save_pretrained(bert)
    word = modules.Transformer(str(bert))
    out = folder / "st"
    dim = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension  # renamed in 6
    SentenceTransformer(modules=[word, modules.Pooling(dim())]).save(str(out))
    # as all-mpnet-base-v2's config (2021): no dtype, so transformers loads the weights' own
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({k: v for k, v in config.items()
                                                 if k not in ("dtype", "torch_dtype")}))
    return out


def test_a_slim_fp16_teacher_encodes_under_bf16_autocast(monkeypatch, tmp_path: Path) -> None:
    """`disan slim` halves a teacher to carry it to a GPU; loaded as stored it was an fp16 model
    whose layer norms refused bf16 autocast (`disan teacher` died on the dry run of a GPU lease).
    `embeddings._sentence_encoder`, which every reader of a teacher folder goes through, casts it."""
    pytest.importorskip("torch")
    pytest.importorskip("sentence_transformers", reason="the teacher's loader is the `mpnet` extra")
    from sentence_transformers import SentenceTransformer

    from disan.distill import teacher
    from disan.train import word_vectors as embeddings
    from research.slim import slim_teacher

    full = _tiny_sentence_transformer(tmp_path)
    slim_teacher(full, tmp_path / "half")
    texts = ["a man plays the guitar", "the dog runs"]
    want = SentenceTransformer(str(full), device="cpu").encode(texts, normalize_embeddings=True)
    monkeypatch.setattr(embeddings, "mpnet_model_dir", lambda: tmp_path / "half")  # the folder it loads
    got = teacher.sentence_transformer_encoder("mpnet", precision="bf16")(texts)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.min(np.sum(got * want, axis=1)) > 0.99  # bf16 activations, fp16-rounded weights


def test_derived_corpus_keeps_the_prefix_vectors_and_appends_questions(tmp_path: Path) -> None:
    from disan.distill.corpus.build import read_corpus
    from disan.distill.teacher import derive_corpus

    sentences = ["a cat sat .", "why not ?", "dogs run .", "it rains .", "who is he ?", "no .", "how many ?"]
    write_corpus_folder(tmp_path / "src", sentences)
    _, info = read_corpus(tmp_path / "src")
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((len(sentences), 384)).astype(np.float32)
    src = TeacherCache.open(tmp_path / "src" / "teacher-minilm", info["sha256"], "minilm", len(vectors), 384)
    src.write(0, vectors[:5])

    with pytest.raises(ValueError, match="only 5 rows"):
        derive_corpus(tmp_path / "src", "minilm", 6, "questions", tmp_path / "bad")
    derived = derive_corpus(tmp_path / "src", "minilm", 4, "questions", tmp_path / "q")
    got, _ = read_corpus(tmp_path / "q")  # its hash checks out
    assert got == sentences[:4] + ["who is he ?", "how many ?"]
    assert derived["derived_from"] == {"sha256": info["sha256"], "keep": 4, "append": "questions",
                                       "appended": 2}
    cache = TeacherCache.open(tmp_path / "q" / "teacher-minilm", derived["sha256"], "minilm", 6, 384)
    assert cache.done == 4
    np.testing.assert_array_equal(cache.vectors(), vectors[:4].astype(np.float16))
    encoded: list[str] = []
    encode_corpus(got, cache, lambda t: (encoded.extend(t), np.zeros((len(t), 384)))[1], log=lambda _m: None)
    assert encoded == ["who is he ?", "how many ?"]  # only the appended rows reach the teacher


def test_derive_refuses_to_overwrite_its_source_or_keep_nothing(tmp_path: Path) -> None:
    from disan.distill.teacher import derive_corpus

    sentences = ["a cat sat .", "who is he ?"]
    write_corpus_folder(tmp_path / "src", sentences)
    before = (tmp_path / "src" / "sentences.txt").read_bytes()
    with pytest.raises(ValueError, match="is the source corpus itself"):
        derive_corpus(tmp_path / "src", "minilm", 1, "questions", tmp_path / "src")
    with pytest.raises(ValueError, match="--keep 0: give how many cached rows to keep"):
        derive_corpus(tmp_path / "src", "minilm", 0, "questions", tmp_path / "q")
    assert (tmp_path / "src" / "sentences.txt").read_bytes() == before


def test_derive_appends_another_corpus_without_the_kept_rows(tmp_path: Path) -> None:
    from disan.distill.corpus.build import read_corpus
    from disan.distill.teacher import derive_corpus

    sentences = ["a cat sat .", "dogs run .", "it rains .", "no ."]
    write_corpus_folder(tmp_path / "src", sentences)
    write_corpus_folder(tmp_path / "mail", ["thanks for the patch .", "Dogs  run .", "it rains ."])
    _, info = read_corpus(tmp_path / "src")
    _, mail = read_corpus(tmp_path / "mail")
    src = TeacherCache.open(tmp_path / "src" / "teacher-minilm", info["sha256"], "minilm", 4, 384)
    src.write(0, np.ones((3, 384), dtype=np.float32))
    derived = derive_corpus(tmp_path / "src", "minilm", 3, "questions", tmp_path / "m",
                            append_from=tmp_path / "mail")
    got, _ = read_corpus(tmp_path / "m")
    # the kept rows, then the other corpus's rows that are not among them (by the corpus's key)
    assert got == sentences[:3] + ["thanks for the patch ."]
    assert derived["derived_from"]["append"] == f"corpus {mail['sha256']}"
    assert derived["derived_from"]["appended"] == 1


def test_a_reader_opens_an_existing_cache_and_refuses_a_missing_one(tmp_path: Path) -> None:
    cache = TeacherCache.open(tmp_path / "c", "abc", "fake", 4, 3)
    cache.write(0, np.ones((2, 3)))
    read = TeacherCache.read(tmp_path / "c")
    assert (read.teacher, read.rows, read.dim, read.done) == ("fake", 4, 3, 2)
    assert read.vectors().shape == (2, 3)
    with pytest.raises(ValueError, match="no teacher cache"):
        TeacherCache.read(tmp_path / "none")


@pytest.mark.parametrize(("faster", "want"), [(False, "fp32"), (True, "bf16")])
def test_disan_teacher_says_what_auto_ran_in(tmp_path: Path, monkeypatch, capsys, faster, want) -> None:
    """`auto` depends on the machine (a flag and a timing), so the log says what it chose."""
    pytest.importorskip("torch")
    from disan.cli import main
    from disan.distill import teacher

    write_corpus_folder(tmp_path / "c", ["a cat sat .", "dogs run ."])
    monkeypatch.setattr(teacher, "native_bf16", lambda device: True)
    monkeypatch.setattr(teacher, "bf16_faster_on_cpu", lambda: faster)
    monkeypatch.setattr(teacher, "sentence_transformer_encoder",
                        lambda *_a, **_k: lambda texts: np.ones((len(texts), 384), dtype=np.float32))
    assert main(["distill", "teacher", "--corpus", str(tmp_path / "c"), "--teacher", "minilm"]) == 0
    assert f"minilm ({want}): 0/2 rows cached" in capsys.readouterr().out


def test_a_derived_corpus_keeps_its_kinds_and_pairs_for_the_student(tmp_path: Path) -> None:
    """`disan distill student` reads kinds.npy and pairs.npy: a derived corpus carries them over,
    with each pair's rows renumbered to where its texts now are."""
    import json

    from disan.distill.corpus.build import read_corpus
    from disan.distill.teacher import derive_corpus

    sentences = ["a cat sat .", "why not ?", "dogs run in the park every day .", "it rains .",
                 "who is he ?", "he is the one who runs the park and the shop .", "how many ?"]
    folder = write_corpus_folder(tmp_path / "src", sentences)
    info = json.loads((folder / "corpus.json").read_text()) | {"relations": {"heading": 2, "question": 1}}
    (folder / "corpus.json").write_text(json.dumps(info))
    np.save(folder / "kinds.npy", np.array([0, 2, 1, 0, 2, 1, 2], np.uint8))
    # both texts kept; an answer that is not appended (the pair goes); a question appended after
    np.save(folder / "pairs.npy", np.array([[1, 2, 0], [4, 5, 1], [6, 3, 0]], np.int32))
    cache = TeacherCache.open(folder / "teacher-minilm", info["sha256"], "minilm", len(sentences), 384)
    cache.write(0, np.zeros((4, 384), np.float32))
    derive_corpus(folder, "minilm", 4, "questions", tmp_path / "q")
    got, derived = read_corpus(tmp_path / "q")
    assert got == sentences[:5] + ["how many ?"]
    assert np.load(tmp_path / "q" / "kinds.npy").tolist() == [0, 2, 1, 0, 2, 2]
    pairs = np.load(tmp_path / "q" / "pairs.npy").tolist()
    names = list(derived["relations"])
    assert [(got[q], got[p], names[r]) for q, p, r in pairs] == [
        ("why not ?", "dogs run in the park every day .", "heading"), ("how many ?", "it rains .", "heading")]
