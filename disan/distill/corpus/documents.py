"""Documents for the corpus (TORCH-FREE): running text with an optional title, and the parsers that
find them in HTML, Perl's POD, roff man pages and part-of-speech tagged text.

A `Doc` is what a source yields when it knows more than paragraphs: a title that describes the
text below it (a heading and its section, a question and its answer, a package's one-line
description and its long one, a headline and its story). `disan.distill.corpus.build` cuts its paragraphs into
sentences and passages and pairs the title with the first passage, so the student learns to find a
passage from a short text that asks for it.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass
class Doc:
    paragraphs: list[str]
    title: str = ""     # a short text that describes or asks for the paragraphs ("" when none)
    relation: str = ""  # what the title is to the text: heading, question, description, headline, title
    questions: list[str] = field(default_factory=list)  # extra query-like texts (not paired)


def as_doc(item: str | Doc) -> Doc:
    return item if isinstance(item, Doc) else Doc([item])


# --- HTML ---------------------------------------------------------------------------------------
_HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6", "dt"}
_BLOCKS = {"p", "li", "dd", "blockquote"}
_SKIP = {"pre", "script", "style", "nav", "table", "head", "code", "kbd", "samp", "footer", "header"}
_SKIP_CLASS = re.compile(r"toc|sidebar|related|navigation|breadcrumb|headerlink|footer|header|highlight")
_VOID = {"br", "img", "hr", "meta", "link", "input", "wbr", "col", "area", "base", "source", "embed"}
_NUMBERING = re.compile(r"^(?:(?:Chapter|Section|Appendix|Part)\s+)?(?:\d+|[A-Z]|[IVX]+)(?:\.\d+)*\.\s+"
                        r"|^\d+(?:\.\d+)*\s+")


class _Sections(HTMLParser):
    """Collects (heading, paragraphs) in document order; text inside code, tables and navigation is
    dropped, and a block nested in another (a <p> in an <li>) belongs to the outer one."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.docs: list[Doc] = [Doc([])]
        self.skip: list[str] = []  # open tags whose text is dropped
        self.buf: list[str] | None = None
        self.open = ""  # the tag that opened the text being collected
        self.depth = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in _VOID:
            if tag == "br" and self.buf is not None:
                self.buf.append(" ")
            return
        cls = dict(attrs).get("class") or ""
        if self.skip or tag in _SKIP or _SKIP_CLASS.search(cls):
            self.skip.append(tag)  # everything inside a dropped element is dropped with it
        elif self.buf is not None:
            self.depth += tag == self.open
        elif tag in _HEADINGS or tag in _BLOCKS or (tag == "div" and cls == "para"):
            self.buf, self.open, self.depth = [], tag, 1

    def handle_endtag(self, tag: str) -> None:
        if self.skip:
            if tag in self.skip:  # HTML in the wild leaves tags open: close up to the match
                while self.skip.pop() != tag:
                    pass
            return
        if self.buf is None or tag != self.open:
            return
        self.depth -= 1
        if self.depth > 0:
            return
        text = " ".join("".join(self.buf).split())
        if self.open in _HEADINGS:
            self.docs.append(Doc([], title=_NUMBERING.sub("", text.rstrip("¶ ")), relation="heading"))
        elif text:
            self.docs[-1].paragraphs.append(text)
        self.buf = None

    def handle_data(self, data: str) -> None:
        if self.buf is not None and not self.skip:
            self.buf.append(data)


def html_sections(text: str) -> list[Doc]:
    """The sections of an HTML page: each heading with the paragraphs up to the next heading (the
    text before the first heading is a section without a title)."""
    parser = _Sections()
    parser.feed(text)
    parser.close()
    return [d for d in parser.docs if d.paragraphs]


# --- Perl's POD -----------------------------------------------------------------------------------
_POD_CODES = re.compile(r"[BICFLSEXZ]<(?:<+\s)?([^<>]*?)(?:\s>+)?>")
_POD_ENTITIES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/"}


def _pod_text(text: str) -> str:
    for _ in range(3):  # nested formatting codes, innermost first
        text = _POD_CODES.sub(lambda m: m.group(1).split("|")[0], text)
    return re.sub(r"E<(\w+)>", lambda m: _POD_ENTITIES.get(m.group(1), ""), " ".join(text.split()))


def pod_sections(text: str) -> list[Doc]:
    """The sections of a POD document: =headN lines and the ordinary paragraphs under them
    (verbatim, indented paragraphs are code and are dropped; so are =item lists' labels)."""
    docs = [Doc([])]
    for block in re.split(r"\n\s*\n", text):
        if not block.strip() or block[0] in " \t":
            continue
        if block.startswith("=head"):
            _, _, heading = block.partition(" ")
            docs.append(Doc([], title=_pod_text(heading), relation="heading"))
        elif not block.startswith("="):
            docs[-1].paragraphs.append(_pod_text(block))
    return [d for d in docs if d.paragraphs]


# --- roff man pages -------------------------------------------------------------------------------
_ROFF_ESC = re.compile(r"\\f[BIRP]|\\f\(..|\\f\[[^\]]*\]|\\\(..|\\\[[^\]]*\]|\\[&:%|^]|\\s[+-]?\d")
_ROFF_INLINE = (".B", ".I", ".IR", ".BR", ".RB", ".RI", ".IB", ".BI", ".SM")


def _roff(text: str) -> str:
    return _ROFF_ESC.sub("", text).replace("\\-", "-").replace("\\e", "\\").replace('"', "")


def man_sections(lines: Iterable[str]) -> list[Doc]:
    """A man page as sections: NAME's one-line description ("ls - list directory contents") is the
    title of DESCRIPTION; every other section is titled by its heading. Code (.nf/.EX) is dropped."""
    docs: list[Doc] = []
    para: list[str] = []
    section = ""
    code = False
    summary = ""

    def flush() -> None:
        nonlocal summary
        if para and docs:
            text = _roff(" ".join(para))
            if section == "NAME":
                summary = text.partition(" - ")[2].strip() or summary
            else:
                docs[-1].paragraphs.append(text)
        para.clear()

    for line in lines:
        line = line.rstrip("\n")
        if line.startswith((".nf", ".EX")):
            code = True
        elif line.startswith((".fi", ".EE")):
            code = False
        if code or line.startswith(('.\\"', "'\\\"")):
            continue
        if line.startswith((".SH", ".SS")):
            flush()
            section = _roff(line[4:]).strip().upper() if line.startswith(".SH") else section
            heading = _roff(line[4:]).strip()
            if line.startswith(".SH") and section == "DESCRIPTION" and summary:
                docs.append(Doc([], title=summary, relation="description"))
            else:
                docs.append(Doc([], title=heading.capitalize() if heading.isupper() else heading,
                                relation="heading"))
        elif line.startswith("."):
            macro, _, args = line.partition(" ")
            if macro in _ROFF_INLINE and args:
                para.append(args)
            else:
                flush()
        else:
            para.append(line)
    flush()
    return [d for d in docs if d.paragraphs]


# --- part-of-speech tagged text ---------------------------------------------------------------------
_PTB_ESC = {"``": '"', "''": '"', "-LRB-": "(", "-RRB-": ")"}


def untag(tokens: Iterable[str], sep: str) -> str:
    """Tagged tokens (word/TAG or word_TAG) back to ordinary text."""
    words = [_PTB_ESC.get(w, w) for w in (t.rsplit(sep, 1)[0] for t in tokens) if w]
    text = " ".join(words)
    text = re.sub(r" (n't|'s|'re|'ve|'ll|'d|'m)\b", r"\1", text)
    text = re.sub(r' ([.,;:!?)\]%])', r"\1", text)
    text = re.sub(r'([(\[$]) ', r"\1", text)
    return re.sub(r'" ([^"]*?) "', r'"\1"', text)


def unescape(text: str) -> str:
    return " ".join(html.unescape(text).split())


def chunks(lines: Iterable[str]) -> Iterator[list[str]]:
    """Groups of non-blank lines separated by blank lines."""
    block: list[str] = []
    for line in lines:
        if line.strip():
            block.append(line.strip())
        elif block:
            yield block
            block = []
    if block:
        yield block
