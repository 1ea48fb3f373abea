"""Head-swapped question rewrites (`research.question_variants`)."""

from __future__ import annotations

import random

from research.question_variants import HEADS, NOUNS, head_class, split_question, variants, with_variants


def test_only_head_aux_rest_questions_are_split() -> None:
    assert split_question("When did Shelby announce she was expecting?") == (
        "When", "did Shelby announce she was expecting?")
    assert split_question("In what year did Ted Kennedy run for President?") == (
        "In what year", "did Ted Kennedy run for President?")
    # No question word first, no auxiliary near the head, not a question: left alone.
    assert split_question("In Steel Magnolias, during which holiday did Shelby announce it?") is None
    assert split_question("Who wrote The Old Man and the Sea?") is None
    assert split_question("What did he say.") is None
    assert split_question("Why did?") is None


def test_heads_are_classified_by_the_answer_they_ask_for() -> None:
    assert head_class("How many seasons") == "number"
    assert head_class("In which country") == "location"
    assert head_class("Whom") == "human"
    assert head_class("Why") == "description"
    assert head_class("What") == "entity"
    assert head_class("Which of these people") is None


def test_variants_keep_the_rest_and_ask_for_other_classes() -> None:
    rng = random.Random(0)
    question = "When did the animated series first air?"
    out = variants(question, 3, rng)
    assert len(out) == 3
    heads = [v.removesuffix(" did the animated series first air?") for v in out]
    assert all(v.endswith(" did the animated series first air?") for v in out)
    classes = [head_class(h) for h in heads]
    assert len(set(classes)) == 3 and "number" not in classes
    # After a copula only bare question words follow (no "Which team is ...").
    for v in variants("Where is the oldest museum in Europe?", 4, rng):
        assert v.split()[0] in {"When", "Who", "Why", "How", "What"} and v.split()[1] == "is"


def test_of_noun_questions_change_their_noun() -> None:
    """"What is the population of X?" asks for a number because of its noun; its rewrites change
    the noun to one of another class and keep the head."""
    out = variants("What is the population of Japan today?", 4, random.Random(1))
    assert len(out) == 4
    nouns = [v.removeprefix("What is the ").removesuffix(" of Japan today?") for v in out]
    own = {n for n in NOUNS["number"]}
    assert not own & set(nouns)
    assert {cls for n in nouns for cls, ns in NOUNS.items() if n in ns} == set(NOUNS) - {"number"}


def test_with_variants_is_deterministic_and_keeps_every_question_first() -> None:
    questions = ["Why did the dinosaurs die out?", "Who wrote The Old Man and the Sea?"]
    out = with_variants(questions, per_question=2, seed=3)
    assert out == with_variants(questions, per_question=2, seed=3)
    assert out[0] == questions[0] and out[-1] == questions[1] and len(out) == 4
    assert with_variants(questions, per_question=0) == questions
    assert set(HEADS) == set(NOUNS)
