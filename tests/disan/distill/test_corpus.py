"""disan corpus: sentence splitting, filters, dedup, evaluation exclusion, shuffled output."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from disan.distill.corpus import build as corpus
from disan.distill.corpus.sources import Source, detokenize

DATA = Path(__file__).resolve().parents[4] / "shared" / "data"


def _source(name: str, paragraphs: list[str]) -> Source:
    return Source(name, "test", "CC0", lambda _root: iter(paragraphs), staged=True)


def test_split_and_keep() -> None:
    parts = corpus.split_sentences("The cat sat on the mat. Then it left!  \"Why?\" he asked the dog.")
    assert parts == ["The cat sat on the mat.", "Then it left!", "\"Why?\" he asked the dog."]
    assert corpus.keep("A perfectly ordinary sentence here.", 4, 48)
    assert not corpus.keep("Too short.", 4, 48)
    assert not corpus.keep("See https://example.org for the whole story today.", 4, 48)
    assert not corpus.keep("x = foo_bar(1, 2) + baz[3]", 4, 48)


def test_build_dedups_excludes_and_records(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(corpus, "eval_keys", lambda _data: {corpus.key("A test sentence we must never see.")})
    sources = [_source("one", ["A first sentence of the corpus. A TEST sentence  we must never see."]),
               _source("two", ["A first sentence of the corpus. Another sentence that is new here."])]
    info = corpus.build(sources, tmp_path, None, tmp_path / "out")
    sentences, read_info = corpus.read_corpus(tmp_path / "out")
    assert sorted(sentences) == ["A first sentence of the corpus.", "Another sentence that is new here."]
    assert read_info == info
    one, two = info["sources"]
    assert (one["kept"], one["eval_dropped"], two["duplicates"], two["kept"]) == (1, 1, 1, 1)
    assert info["eval_dropped"] == 1 and one["licence"] == "CC0"


def test_read_corpus_refuses_edited_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(corpus, "eval_keys", lambda _data: set())
    corpus.build([_source("one", ["One sentence that is long enough."])], tmp_path, None, tmp_path / "c")
    (tmp_path / "c" / "sentences.txt").write_text("something else entirely, four tokens\n")
    with pytest.raises(ValueError, match="does not match"):
        corpus.read_corpus(tmp_path / "c")


def test_detokenize_ptb() -> None:
    assert detokenize("it does n't work -LRB- really -RRB- , ok ?") == "it doesn't work (really), ok?"


@pytest.mark.skipif(not (DATA / "stsb" / "dev.jsonl.gz").is_file(), reason="staged data not present")
def test_eval_keys_cover_every_eval_set() -> None:
    keys = corpus.eval_keys(DATA)
    # one sentence of each kind: STS-B dev, SICK dev, SST test, MR, TREC test
    import gzip
    import json

    for rel, field in [("stsb/dev.jsonl.gz", "sentence1"), ("senteval/SICK/sick_dev.jsonl.gz", "sentence_a"),
                       ("sst/sst5_test.jsonl.gz", "text"), ("senteval/MR/mr.jsonl.gz", "text"),
                       ("senteval/TREC/trec_test.jsonl.gz", "text")]:
        first = json.loads(gzip.open(DATA / rel, "rt").readline())[field]
        assert corpus.key(first) in keys, rel


def _mail(folder: Path, name: str, text: str) -> None:
    import json

    (folder / "data" / "easy-ham-1").mkdir(parents=True, exist_ok=True)
    (folder / "data" / "easy-ham-1" / name).write_text(json.dumps({"text": text}))


def test_mailing_lists_keep_what_the_writer_wrote(tmp_path: Path) -> None:
    from disan.distill.corpus.sources import SOURCES

    source = next(s for s in SOURCES if s.name == "mailing-lists")
    assert source.default and source.npm  # conversational text users embed: in the default corpus
    _mail(tmp_path, "1.json", "From: a@b\nSubject: pasta\n\nMartin wrote:\n> You mix in the raw egg.\n"
          "> That's my understanding.\n\nYou're probably right, mine's the same\nbut with cream.\n\n"
          "Stew\n-- \nStewart Smith, University of Edinburgh.\n")
    _mail(tmp_path, "2.json", "Subject: ad\n\n<html><body>Buy now</body></html>\n")
    assert list(source.read(tmp_path)) == ["You're probably right, mine's the same but with cream.", "Stew"]


def test_npm_sources_need_their_folder(tmp_path: Path, monkeypatch) -> None:
    from disan.distill.corpus.sources import SOURCES

    monkeypatch.setattr(corpus, "eval_keys", lambda _data: set())
    source = next(s for s in SOURCES if s.name == "mailing-lists")
    with pytest.raises(ValueError, match="--npm-dir"):
        corpus.build([source], tmp_path, None, tmp_path / "out")
    package = tmp_path / "npm" / source.npm.replace("/", "+") / "package"
    _mail(package, "1.json", "Subject: x\n\nThe new kernel boots fine on my old laptop.\n")
    (package / "package.json").write_text("{}")  # already unpacked: nothing is fetched
    info = corpus.build([source], tmp_path, None, tmp_path / "out", npm_dir=tmp_path / "npm")
    assert corpus.read_corpus(tmp_path / "out")[0] == ["The new kernel boots fine on my old laptop."]
    assert info["sources"][0]["licence"].startswith("Apache-2.0")


def test_a_missing_or_failing_fetch_tool_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    # Both used to end in a traceback: RuntimeError and CalledProcessError are not the CLI's
    # one-line errors.
    from disan.cli import main
    from disan.distill.corpus import sources as corpus_sources

    monkeypatch.setattr(corpus, "eval_keys", lambda _data: set())
    monkeypatch.setattr(corpus_sources.shutil, "which", lambda _tool: None)
    code = main(["distill", "corpus", "--sources", "mailing-lists", "--npm-dir", str(tmp_path / "npm"),
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "`npm` is not installed" in err and "Traceback" not in err
    monkeypatch.setattr(corpus_sources.shutil, "which", lambda tool: "/bin/" + tool)
    with pytest.raises(OSError, match=r"failed \(exit 3\): no such package$"):
        corpus_sources._run(["sh", "-c", "echo no such package >&2; exit 3"])


def _git(*args: str, cwd: Path) -> str:
    import subprocess

    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_sources_read_their_recorded_commit(tmp_path: Path, monkeypatch) -> None:
    """An opt-in repository source (the trivia questions) is read at the commit it records, from
    a clone made once in --git-dir; the answers are not sentences, so only the questions count."""
    from disan.distill.corpus import sources as corpus_sources
    from disan.distill.corpus.sources import SOURCES, Source

    trivia = next(s for s in SOURCES if s.name == "trivia-questions")
    assert trivia.default and trivia.git and not trivia.debian
    upstream = tmp_path / "upstream" / "OpenTriviaQA"
    (upstream / "categories").mkdir(parents=True)
    _git("init", "-q", cwd=upstream)
    (upstream / "categories" / "general").write_text(
        "#Q Which planet is  closest to the Sun?\n^ Mercury\nA Mercury\nB Venus\n\n"
        "#Q Who wrote\tThe Old Man and the Sea?\n^ Hemingway\nA Hemingway\n")
    _git("add", ".", cwd=upstream)
    _git("commit", "-q", "-m", "one", cwd=upstream)
    first = _git("rev-parse", "HEAD", cwd=upstream)
    (upstream / "categories" / "general").write_text("#Q What is a question added later?\n")
    _git("commit", "-q", "-am", "two", cwd=upstream)
    source = Source("t", "test repository", "CC BY-SA 4.0", trivia.read, default=False,
                    git=f"{upstream}@{first}")
    monkeypatch.setattr(corpus, "eval_keys", lambda _data: set())
    with pytest.raises(ValueError, match="--git-dir"):
        corpus.build([source], tmp_path, None, tmp_path / "out")
    corpus.build([source], tmp_path, None, tmp_path / "out", git_dir=tmp_path / "git")
    assert sorted(corpus.read_corpus(tmp_path / "out")[0]) == ["Which planet is closest to the Sun?",
                                                               "Who wrote The Old Man and the Sea?"]
    assert (tmp_path / "git" / "upstream+OpenTriviaQA" / ".git").is_dir()
    # A commit the checkout cannot reach is a one-line OSError, not a traceback.
    with pytest.raises(OSError, match="failed"):
        corpus_sources.fetch_git(tmp_path / "git", f"{upstream}@{'0' * 40}")


def test_movie_reviews_are_the_review_sentences_alone(tmp_path: Path) -> None:
    """NLTK's movie_reviews.zip: every line of every review is a sentence; the README is not read,
    and neither is the pos/neg folder a review sits in (the source is text to label, not labels)."""
    import zipfile

    from disan.distill.corpus.sources import SOURCES

    reviews = next(s for s in SOURCES if s.name == "movie-reviews")
    assert not reviews.default and reviews.git.endswith("@5db857e6f7df11eabb5e5665836db9ec8df07e28")
    archive = tmp_path / "packages/corpora/movie_reviews.zip"
    archive.parent.mkdir(parents=True)
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("movie_reviews/README", "Sentiment Polarity Dataset Version 2.0\n")
        z.writestr("movie_reviews/pos/cv000_1.txt", "a fine film , it is .\n\nthe  cast shines .\n")
        z.writestr("movie_reviews/neg/cv001_2.txt", "it drags on and on .\n")
    assert list(reviews.read(tmp_path)) == ["it drags on and on .", "a fine film , it is .",
                                            "the cast shines ."]
