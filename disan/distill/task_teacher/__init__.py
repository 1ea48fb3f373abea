"""`disan distill task-teacher`: a sentence-transformer fine-tuned on a sentiment task (`cli`: the
fit and the command), its classifier (`classifier`), the labels it writes in resumable chunks
(`labels`), sentence variants for it to label (`augment`) and trained sentiment models' mean as the
teacher instead (`checkpoints`, `--checkpoints`).

May import: as `disan.distill` (its parent), and the pending flat `disan.corpus` /
`disan.teacher`.
"""
