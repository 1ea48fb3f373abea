"""disan corpus's documents: passages, queries and (query, passage) pairs; the HTML, POD and man
page parsers that find titles."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from disan.distill.corpus import build as corpus
from disan.distill.corpus.documents import Doc, html_sections, man_sections, pod_sections
from disan.distill.corpus.sources import Source

STORY = ("The river rose three metres overnight after the storm. Farmers moved their cattle to higher "
         "ground before dawn. The council opened two shelters in the town hall. Roads to the north stayed "
         "closed until the water fell.")


def _docs(name: str, docs: list) -> Source:
    return Source(name, "test", "CC0", lambda _root: iter(docs), staged=True)


def test_a_title_is_paired_with_its_first_passage(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(corpus, "eval_keys", lambda _data: set())
    doc = Doc([STORY], title="Floods close northern roads", relation="headline",
              questions=["when will the roads open?", "x = f(y)"])
    info = corpus.build([_docs("news", [doc])], tmp_path, None, tmp_path / "out", passage_words=(10, 20))
    texts, _ = corpus.read_corpus(tmp_path / "out")
    kinds = np.load(tmp_path / "out" / "kinds.npy")
    pairs = np.load(tmp_path / "out" / "pairs.npy")
    by_kind = {k: sorted(t for t, n in zip(texts, kinds, strict=True) if n == i)
               for i, k in enumerate(corpus.KINDS)}
    assert by_kind["query"] == ["Floods close northern roads", "when will the roads open?"]  # not the code
    assert len(by_kind["sentence"]) == 4 and len(by_kind["passage"]) == 2
    assert all(len(p.split()) <= 20 for p in by_kind["passage"])
    (query, passage, relation), = pairs
    assert texts[query] == "Floods close northern roads"
    assert texts[passage].startswith("The river rose") and kinds[passage] == corpus.PASSAGE
    assert info["relations"] == {"headline": 1} and relation == 0
    assert info["kinds"] == {"sentence": 4, "passage": 2, "query": 2} and info["sources"][0]["pairs"] == 1


def test_a_passage_holding_an_evaluation_sentence_is_dropped(tmp_path: Path, monkeypatch) -> None:
    held_out = "Farmers moved their cattle to higher ground before dawn."
    monkeypatch.setattr(corpus, "eval_keys", lambda _data: {corpus.key(held_out)})
    corpus.build([_docs("news", [Doc([STORY])])], tmp_path, None, tmp_path / "out", passage_words=(10, 20))
    texts, info = corpus.read_corpus(tmp_path / "out")
    assert not any("cattle" in t for t in texts)
    assert info["sources"][0]["eval_dropped"] == 2  # the sentence and the passage that holds it


def test_html_sections_keep_prose_under_its_heading() -> None:
    page = """<html><nav><p>Home</p></nav><div class="toctree-wrapper"><ul><li>Contents</li></ul></div>
    <h1>2.1 Installing<a class="headerlink" href="#">¶</a></h1><p>Run the <code>pip</code> installer
    first.</p><div class="highlight"><pre>pip install x</pre></div><div class="para">Then start it.<br/>Done.
    </div><h2>I can't log in?</h2><ul><li><p>Check the cookie domain.</p></li></ul></html>"""
    assert [(d.title, d.paragraphs) for d in html_sections(page)] == [
        ("Installing", ["Run the installer first.", "Then start it. Done."]),
        ("I can't log in?", ["Check the cookie domain."])]


def test_pod_and_man_pages_give_titled_sections() -> None:
    pod = "=head1 NAME\n\nperlfaq - questions\n\n=head2 How do I sort a hash?\n\nUse C<sort> on the " \
          "I<keys>.\n\n    my @k = sort keys %h;\n\n=cut\n"
    assert [(d.title, d.paragraphs) for d in pod_sections(pod)] == [
        ("NAME", ["perlfaq - questions"]), ("How do I sort a hash?", ["Use sort on the keys."])]
    man = [".TH LS 1", ".SH NAME", "ls \\- list directory contents", ".SH DESCRIPTION",
           "List information about the FILEs.", ".PP", ".B Sort", "entries alphabetically.", ".nf",
           "ls -l", ".fi", ".SH SEE ALSO", "dir(1)"]
    docs = man_sections(man)
    assert (docs[0].title, docs[0].relation) == ("list directory contents", "description")
    assert docs[0].paragraphs == ["List information about the FILEs.", "Sort entries alphabetically."]
    assert (docs[1].title, docs[1].paragraphs) == ("See also", ["dir(1)"])
