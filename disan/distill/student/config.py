"""What a `disan distill student` run is asked to do (its flags, `disan.distill.student.cli`), checked
before any corpus or cache is read."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class StudentConfig:
    corpus: Path
    out: Path
    teacher: Path | None = None  # the teacher cache (default: CORPUS/teacher-mpnet)
    tokenizer: Path | None = None  # tokenizer.json (default: the teacher's own)
    embed_dim: int = 256
    d_h: int = 256
    proj_dim: int = 768
    # directional layers (DiSANConfig.layers); an --init student with fewer grows: its layers are
    # kept and each new one starts as a pass-through (gain 0)
    layers: int = 1
    keep_prob: float = 0.9  # dropout keep probability (the paper's 0.75 is for the task models)
    dims: tuple[int, ...] = (768, 512, 256, 128)
    max_pieces: int = 128
    # a text longer than max_pieces read as the embed route reads it (windows of max_pieces, pooled
    # with the first counting twice) rather than cut: the long rows and the pairs' passages then
    # train the document vectors the bundle serves
    windows: bool = False
    batch_size: int = 128
    pairs_batch: int = 64
    pairs_weight: float = 1.0
    # distil into the teacher's space turned onto its principal axes (cosines unchanged), so that
    # a prefix of the target is its best summary of that size, and distil every prefix
    rotate_teacher: bool = True
    geometry_weight: float = 1.0
    mnr_scale: float = 20.0
    lr: float = 4e-3
    warmup_steps: int = 100  # the learning rate rises linearly over these steps, then falls to zero
    head_lr_scale: float = 1.0  # the projection's learning rate, times lr (a fitted head moves less)
    # the token table's learning rate, times lr: a row moves only in the steps whose batch holds its
    # piece, by about lr a coordinate a step under Adam, so at a rate chosen for the blocks an --init
    # table stays where it was (--tune rows: --lr is the table's rate)
    table_lr_scale: float = 1.0
    steps: int = 2000
    max_minutes: float | None = None
    val_rows: int = 1024
    eval_every: int = 250
    # the projection starts as the ridge map from the untrained encoder's vectors of this many rows
    # to the teacher's (0: random), so distillation starts where a linear probe of it would
    fit_head_rows: int = 16384
    # blocks set so that the untrained encoder reads its table statically (a linear map of the mean
    # of its rows): a trained static table (research.static_pieces --save-table) is then the start,
    # not something random blocks scramble before the first step
    static_start: bool = False
    length_buckets: int = 4  # a batch runs as this many length-sorted parts: far less padding
    resume: bool = False  # continue OUT's run from its state.pt (same flags, same schedule)
    # start from an earlier student's weights (same tokenizer and shape) with a new optimizer and
    # schedule: a longer run on a grown teacher cache need not repeat the steps already taken
    init: Path | None = None
    # "rows": train only the table rows the --init student marks trainable (research.pieces_from_words
    # marks the pieces it did not take from a word table); its blocks, head and other rows stay.
    # "head": train only the projection, so the encoder's own vector (what the transfer tasks and
    # the task models' habits were fitted to) stays and the pairs teach a metric on it.
    # "blocks": everything but the token table (a new student's too: its table, trained as a static
    # encoder on the same rows, has fitted them already)
    tune: str = "all"
    # the share of each target that is the --init student's own vector of the row (unit vectors
    # mixed, then normalised): 0 distils the teacher alone; above 0 the start holds what the
    # teacher would pull away (what it learned from labelled pairs and glosses) while the pairs teach
    anchor: float = 0.0
    # with --anchor 1 the target is the start's own vector alone, so no teacher cache is read: the
    # phase trains on the corpus's first this many rows (the corpus is shuffled), and its pairs
    anchor_rows: int = 65536
    # distil the teacher's vectors through the --init head's whitening map (research.whiten_head),
    # the coordinates that student serves; without it a phase from a whitened head would pull the
    # head back to the teacher's own coordinates
    whiten_targets: bool = False
    # staged data (../shared/data) for the labelled terms (disan.distill.supervision.StudentLabels)
    data: Path | None = None
    scored_weight: float = 0.0  # STS-B and SICK train pairs' scores, MSE on the cosine
    sentiment_weight: float = 0.0  # SST-5 train phrases through a training-only head, probed first
    # NLI train triples (premise, entailed, contradicting hypothesis): each premise must rank its
    # entailed hypothesis first among the batch's hypotheses, as sentence-transformers' NLI models
    # train; entailment is what the pair features of SICK-E read, and what query -> passage pairs
    # alone do not teach
    nli_weight: float = 0.0
    # NLI train pairs' three classes through a training-only head on [u, v, |u - v|, u * v]
    # (SoftmaxLoss): what SICK-E's classifier reads, which ranking pairs alone wear away
    nli_classes_weight: float = 0.0
    labels_batch: int = 32  # examples a step for each labelled term
    seed: int = 0
    device: str = "cpu"
    threads: int | None = None
    relations: tuple[str, ...] = field(default=())  # pair relations to use (default: all)

    def __post_init__(self) -> None:
        # checked here, before a run reads its corpus and cache: a wrong flag fails at once
        if self.tune not in ("all", "rows", "head", "blocks"):
            raise ValueError(f"tune={self.tune!r}: all, rows, head or blocks")
        if self.tune in ("rows", "head") and self.starts_fresh:
            raise ValueError(f"--tune {self.tune} trains part of an --init (or resumed) student; give --init")
        if self.table_lr_scale <= 0:
            raise ValueError(f"table_lr_scale={self.table_lr_scale}: a factor of --lr above 0")
        if self.table_lr_scale != 1.0 and self.tune != "all":
            raise ValueError(f"--table-lr-scale sets the table's rate beside the blocks' (--tune all); "
                             f"--tune {self.tune} gives --lr to what it trains")
        if self.layers < 1:
            raise ValueError(f"layers={self.layers}: at least 1")
        if not 0.0 <= self.anchor <= 1.0:
            raise ValueError(f"anchor={self.anchor}: a share between 0 and 1")
        weights = (self.scored_weight, self.sentiment_weight, self.nli_weight, self.nli_classes_weight)
        names = "--scored-weight, --sentiment-weight, --nli-weight and --nli-classes-weight"
        if any(w > 0 for w in weights) and self.data is None:
            raise ValueError(f"{names} read the staged data; give --data")
        if any(w < 0 for w in weights):
            raise ValueError(f"{names} are weights: 0 or more")
        if self.static_start and not self.starts_fresh:
            raise ValueError("--static-start sets a new student's blocks; an --init or resumed one has its "
                             "own")
        if self.anchor > 0 and self.init is None:
            raise ValueError("--anchor mixes in the --init student's own vectors; give --init")
        if not self.reads_teacher and self.whiten_targets:
            raise ValueError("--anchor 1 reads no teacher: --whiten-targets has nothing to map")
        if self.anchor_rows < 1:
            raise ValueError(f"anchor_rows={self.anchor_rows}: at least 1")
        if self.whiten_targets and (self.init is None or self.rotate_teacher):
            raise ValueError("--whiten-targets maps the teacher's own vectors by the --init head's "
                             "whitening; give --init and --no-rotate-teacher")

    @property
    def starts_fresh(self) -> bool:
        """Its weights start from nothing (no --resume, no --init): only such a run reads the piece
        table's start (RUN/pieces.npy, or the teacher that makes it)."""
        return not self.resume and self.init is None

    @property
    def reads_teacher(self) -> bool:
        """Whether any target holds the teacher's vectors (--anchor 1: the start's own alone)."""
        return self.anchor < 1.0
