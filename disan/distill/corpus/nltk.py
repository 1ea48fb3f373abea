"""Readers of NLTK's corpora (TORCH-FREE), from a checkout of the public nltk_data repository
(`packages/corpora/NAME.zip`): news, fiction and essays, speeches, web text and chat, reviews,
bug reports, patient leaflets and biomedical sentences. Each yields `Doc`s; where a corpus has a
headline, a review title or a leaflet heading, it is the doc's title.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

from disan.distill.corpus.documents import Doc, chunks, unescape, untag


def _zip(root: Path, name: str) -> zipfile.ZipFile:
    return zipfile.ZipFile(root / "packages" / "corpora" / f"{name}.zip")


def _files(archive: zipfile.ZipFile, pattern: str = "") -> Iterator[tuple[str, str]]:
    for name in sorted(archive.namelist()):
        if not name.endswith("/") and "README" not in name and re.search(pattern, name):
            yield name, archive.read(name).decode("utf-8", errors="replace")


def abc(root: Path) -> Iterator[Doc]:
    """ABC (Australian Broadcasting Commission, 2006) science and rural news: stories separated by
    blank lines, one sentence a line; a first line without a full stop is the story's summary."""
    for _, text in _files(_zip(root, "abc"), r"\.txt$"):
        for lines in chunks(text.splitlines()):
            if len(lines) > 2 and not lines[0].endswith((".", "?", "!", '"')):
                yield Doc([" ".join(lines[1:])], title=lines[0], relation="headline")
            else:
                yield Doc([" ".join(lines)])


def brown(root: Path) -> Iterator[Doc]:
    """The Brown corpus (1961 American English, 15 genres): tagged paragraphs, untagged; a file is
    one text."""
    for _, text in _files(_zip(root, "brown"), r"brown/c[a-r]\d\d$"):
        yield Doc([untag(" ".join(p).split(), "/") for p in chunks(text.splitlines())])


def plain(name: str, pattern: str = r"\.txt$") -> Callable[[Path], Iterator[Doc]]:
    """A corpus of plain-text files with paragraphs separated by blank lines (speeches)."""
    def read(root: Path) -> Iterator[Doc]:
        for _, text in _files(_zip(root, name), pattern):
            yield Doc([" ".join(p) for p in chunks(text.splitlines())])
    return read


def webtext(root: Path) -> Iterator[Doc]:
    """Web text: Firefox bug titles (query-like), overheard quotes, wine reviews, personal ads and a
    film script; one unit a line."""
    for name, text in _files(_zip(root, "webtext"), r"\.txt$"):
        lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
        if name.endswith("firefox.txt"):
            yield Doc([], questions=lines)
        else:
            for line in lines:
                yield Doc([re.sub(r"^[A-Z][\w #.]{0,24}: ", "", line)])


_POST = re.compile(r'<Post class="(\w+)"[^>]*>([^<]*)<')


def nps_chat(root: Path) -> Iterator[Doc]:
    """NPS chat room posts (2006): questions are queries, statements sentences; system events and
    emoticons are dropped."""
    for _, text in _files(_zip(root, "nps_chat"), r"\.xml$"):
        for kind, post in _POST.findall(text):
            post = unescape(post)
            if kind in ("whQuestion", "ynQuestion"):
                yield Doc([], questions=[post])
            elif kind in ("Statement", "Emphasis", "Reject", "Accept", "Clarify", "Continuer"):
                yield Doc([post])


def masc(root: Path) -> Iterator[Doc]:
    """MASC's written part (blogs, email, essays, fiction, government, journal, letters, news, travel
    guides, technical, twitter ...), word_TAG tokens, untagged."""
    for _, text in _files(_zip(root, "masc_tagged"), r"masc_tagged/written/"):
        paras = [untag(" ".join(p).split(), "_") for p in chunks(text.splitlines())]
        yield Doc([p for p in paras if p])


_IEER = re.compile(r"<HEADLINE>(.*?)</HEADLINE>.*?<TEXT>(.*?)</TEXT>", re.S)
_TAGS = re.compile(r"<[^>]*>")


def ieer(root: Path) -> Iterator[Doc]:
    """NIST IE-ER news stories (APW, NYT 1998): the headline and the story."""
    for _, text in _files(_zip(root, "ieer"), r"ieer/[A-Z]"):
        for headline, body in _IEER.findall(text):
            body = re.sub(r"^.*?\) _ ", "", unescape(_TAGS.sub("", body)), count=1)
            yield Doc([body], title=unescape(_TAGS.sub("", headline)), relation="headline")


_PIL = re.compile(r"<(HEAD|BLOCK)[^>]*>(.*?)</\1>", re.S)


def pil(root: Path) -> Iterator[Doc]:
    """Patient information leaflets (ABPI 1996-97): each heading with the blocks under it."""
    for _, text in _files(_zip(root, "pil"), r"\.sgml$"):
        doc = Doc([])
        for tag, body in _PIL.findall(text):
            body = unescape(_TAGS.sub(" ", re.sub(r"&\w+;", "", body)))
            if tag == "HEAD":
                if doc.paragraphs:
                    yield doc
                doc = Doc([], title=body, relation="heading")
            elif body:
                doc.paragraphs.append(body)
        if doc.paragraphs:
            yield doc


def biocreative(root: Path) -> Iterator[Doc]:
    """BioCreAtIvE PPI: sentences from biomedical abstracts."""
    archive = _zip(root, "biocreative_ppi")
    text = archive.read("biocreative_ppi/bc_sentences.xml").decode("utf-8", errors="replace")
    for sentence in re.findall(r"<sentence[^>]*>(.*?)</sentence>", text, re.S):
        yield Doc([unescape(_TAGS.sub("", sentence))])


def problem_reports(root: Path) -> Iterator[Doc]:
    """Bug report titles of Apache, Eclipse, Firefox, Linux and OpenOffice (tagged): query-like."""
    for _, text in _files(_zip(root, "problem_reports"), r"problem_reports/\w+$"):
        yield Doc([], questions=[untag(line.split(), "/") for line in text.splitlines() if line.strip()])


def pros_cons(root: Path) -> Iterator[Doc]:
    for _, text in _files(_zip(root, "pros_cons"), r"Integrated"):
        for body in re.findall(r"<(?:Pros|Cons)>(.*?)</(?:Pros|Cons)>", text):
            yield Doc([unescape(body)])


def product_reviews(name: str) -> Callable[[Path], Iterator[Doc]]:
    """Amazon product reviews (Hu and Liu): `[t]` titles, then the review's sentences after `##`."""
    def read(root: Path) -> Iterator[Doc]:
        for _, text in _files(_zip(root, name), r"\.txt$"):
            title, body = "", []
            for line in text.splitlines():
                if line.startswith("[t]"):
                    if body:
                        yield Doc([" ".join(body)], title=title, relation="title")
                    title, body = line[3:].strip(), []
                elif "##" in line:
                    body.append(line.split("##", 1)[1].strip())
            if body:
                yield Doc([" ".join(body)], title=title, relation="title")
    return read


def comparative(root: Path) -> Iterator[Doc]:
    text = _zip(root, "comparative_sentences").read("comparative_sentences/labeledSentences.txt")
    for line in text.decode("utf-8", errors="replace").splitlines():
        if line.strip() and not line.startswith(("<", "#")):
            yield Doc([line.strip()])
