"""The distillation pipeline (`disan distill ...`, torch): `pretrain` / `pretrain_cli` (a sentence
encoder distilled from a teacher's vectors), `loop` (its corpus-scale loop) with its losses and
batches (`supervision`, `whitening`, `neighbours`), and the steps after it: `vocab_extend`,
`borrow_words`, `merge`. `task_teacher/` fine-tunes a sentence-transformer on a sentiment task
and writes the soft labels `disan train --soft-targets` reads.

The corpus (`disan/corpus.py`, its sources `disan/corpus_sources.py` and
`disan/question_variants.py`) and the teacher-vector cache (`disan/teacher.py`) belong here
too; they move in after a pending rewrite.

Owns: turning a teacher into a student checkpoint.
May import: everything in `disan` below it: text, model, bundle, runtime, data, embed, train,
and `disan.optional`.
"""
