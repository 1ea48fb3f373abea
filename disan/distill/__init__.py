"""The distillation pipeline (`disan distill ...`, torch): `corpus/` (the texts users embed, their
(query, passage) pairs, no evaluation text; torch-free), `teacher` (the teacher's vectors of a
corpus, cached and resumable), `student/` (a DiSAN that reads subword pieces, distilled with pairs
and Matryoshka prefixes), `pretrain` / `pretrain_cli` (the word-level encoder distilled from a
teacher's vectors), `loop` (its corpus-scale loop) with its losses and batches (`supervision`,
`whitening`, `neighbours`), and the steps after it: `vocab_extend`, `borrow_words`, `whole_words`,
`merge`.
`task_teacher/` fine-tunes a sentence-transformer on a sentiment task and writes the soft labels
`disan train --soft-targets` reads.

Owns: turning a teacher into a student checkpoint.
May import: everything in `disan` below it: text, model, bundle, runtime, data, embed, train,
and `disan.optional`.
"""
