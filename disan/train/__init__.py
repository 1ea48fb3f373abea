"""Training task models (torch): `config` (TrainConfig: its fields are `disan train`'s flags),
`loop` (the training loop), `cli` (`disan train`), `checkpoint` (torch checkpoints, provenance),
`word_vectors` (GloVe / MiniLM / MPNet / random word vectors, vocabulary building), `warm_start`
(a new model from another checkpoint's weights) and `soft_labels` (a task teacher's soft targets).

Owns: turning data into a checkpoint.
May import: `disan.text`, `disan.model`, `disan.bundle`, `disan.runtime`, `disan.data`,
`disan.embed` (its atomic writes), `disan.optional`.
"""
