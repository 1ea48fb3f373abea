"""Questions that keep their topic and change what they ask for (TORCH-FREE).

A question "When did Shelby announce she was expecting?" becomes "Where did Shelby announce she
was expecting?", "Why did ..." and "How many times did ...": the same words after the question's
head, a head of another kind. Distilled beside the original, such a group teaches the student what
the teacher does with the head alone, which a corpus of whole questions, each seen once, did not
(`docs/distillation.md`: TREC loses on questions about numbers and descriptions).

Only questions of the form HEAD AUX REST? are rewritten, where HEAD is a question word (after an
optional preposition) and at most two more words, and AUX an auxiliary verb; that keeps every
variant grammatical in the common case. The heads are grouped by the answer they ask for, the
coarse classes of question classification (Li and Roth 2002), and a question's variants take
heads from classes other than its own.

Measured once (2026-11-28, `docs/distillation.md`, "Questions that differ in what they ask"): a
phase with the rewrites scored lower on TREC than the same phase with the questions alone. The
source stays opt-in, so that the measurement can be repeated (e.g. in a longer run on a GPU).
"""

from __future__ import annotations

import random
import re

WH_WORDS = {"what", "which", "who", "whom", "whose", "where", "when", "why", "how"}
PREPOSITIONS = {"in", "at", "on", "for", "from", "to", "with", "by", "of", "during", "after", "before"}
AUXILIARIES = {"did", "does", "do", "is", "was", "are", "were", "has", "have", "had", "can", "could",
               "will", "would", "should", "might", "must"}

# Heads by the kind of answer they ask for (no abbreviation class: its questions have no head).
HEADS: dict[str, tuple[str, ...]] = {
    "number": ("When", "What year", "How many times", "How long", "How much", "How often", "How far",
               "At what age", "How many people", "What percentage"),
    "location": ("Where", "In which country", "In what city", "From where", "On which continent"),
    "human": ("Who", "Which person", "Which company", "Whom", "Which team"),
    "description": ("Why", "How", "For what reason", "In what way"),
    "entity": ("What", "Which animal", "What colour", "What kind of food", "Which instrument",
               "What language", "Which book"),
}
_CLASS_OF = {head.lower(): cls for cls, heads in HEADS.items() for head in heads}
# After a copula the head is the complement ("Where is the museum?"); a head with a noun would
# not read ("Which team is the museum?"), so those questions take a bare question word.
COPULAS = {"is", "was", "are", "were"}
BARE_HEADS = {"number": ("When",), "location": ("Where",), "human": ("Who",), "description": ("Why", "How"),
              "entity": ("What",)}
# "What is the population of Japan?" asks for a number because of its noun, not its head:
# such questions change their noun instead ("What is the capital of Japan?").
NOUNS: dict[str, tuple[str, ...]] = {
    "number": ("population", "height", "length", "age", "weight", "price", "date", "number", "size",
               "average temperature", "distance"),
    "location": ("capital", "location", "birthplace", "largest city", "hometown"),
    "human": ("founder", "author", "president", "inventor", "owner", "leader"),
    "description": ("meaning", "origin", "purpose", "definition", "significance"),
    "entity": ("name", "colour", "currency", "symbol", "official language", "national animal"),
}
_NOUN_CLASS = {noun: cls for cls, nouns in NOUNS.items() for noun in nouns}
_OF_NOUN = re.compile(r"^(?P<aux>is|was|are|were) the (?P<noun>[a-z]+(?: [a-z]+)?) of (?P<rest>.+)$")


def split_question(question: str) -> tuple[str, str] | None:
    """(head, rest) of a HEAD AUX REST? question, rest starting at the auxiliary; None otherwise."""
    words = question.split()
    if len(words) < 4 or not question.endswith("?"):
        return None
    start = 1 if words[0].lower() in PREPOSITIONS else 0
    if words[start].lower() not in WH_WORDS:
        return None
    for i in range(start + 1, min(start + 4, len(words) - 1)):
        if words[i].lower() in AUXILIARIES:
            return " ".join(words[:i]), " ".join(words[i:])
        if not words[i].isalpha():
            return None  # a comma or a name with digits: not a plain head
    return None


def head_class(head: str) -> str | None:
    """The answer class of a head, where the head is one of HEADS or starts with a known word."""
    lowered = head.lower()
    if lowered in _CLASS_OF:
        return _CLASS_OF[lowered]
    words = lowered.split()
    if words[0] == "how" and len(words) > 1 and words[1] in {"many", "much", "long", "far", "old", "often"}:
        return "number"
    first = words[-1] if words[0] in PREPOSITIONS else words[0]
    return {"when": "number", "where": "location", "who": "human", "whom": "human", "whose": "human",
            "why": "description"}.get(first)


def variants(question: str, per_question: int, rng: random.Random) -> list[str]:
    """Up to `per_question` rewrites of `question` with heads of as many other classes."""
    parts = split_question(question)
    if parts is None or per_question < 1:
        return []
    head, rest = parts
    aux = rest.split()[0].lower()
    of_noun = _OF_NOUN.match(rest) if head.lower() in {"what", "which"} else None
    if of_noun:
        return [f"{head} {of_noun['aux']} the {rng.choice(NOUNS[cls])} of {of_noun['rest']}"
                for cls in _other_classes(_NOUN_CLASS.get(of_noun["noun"]), rng)[:per_question]]
    heads = BARE_HEADS if aux in COPULAS else HEADS
    return [f"{rng.choice(heads[cls])} {rest}"
            for cls in _other_classes(head_class(head), rng)[:per_question]]


def _other_classes(own: str | None, rng: random.Random) -> list[str]:
    """The answer classes but `own`, in a random order (HEADS and NOUNS share their classes)."""
    classes = [c for c in HEADS if c != own]
    rng.shuffle(classes)
    return classes


def with_variants(questions: list[str], per_question: int = 3, seed: int = 0) -> list[str]:
    """Each question followed by its variants (a fixed seed picks the heads)."""
    rng = random.Random(seed)
    out: list[str] = []
    for q in questions:
        out.append(q)
        out.extend(variants(q, per_question, rng))
    return out
