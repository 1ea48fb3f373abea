"""`disan distill student`: a DiSAN that reads subword pieces, distilled from a corpus's teacher
cache with its (query, passage) pairs and Matryoshka prefixes (torch). `config` (StudentConfig: the
run's flags, checked before anything is read), `rows` (the corpus as piece ids, the token table's
start, the teacher's principal axes), `starts` (where a run starts: its tokenizer, `--init`, the
fitted head, `--static-start`, `--anchor`), `state` (what a run writes: student.pt, and state.pt for
`--resume`), `train` (the loss, the evaluation and `train_student`) and `cli` (the command's flags).

May import: as `disan.distill` (its parent), and its `corpus`, `teacher` and `supervision`.
"""
