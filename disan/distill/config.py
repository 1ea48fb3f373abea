"""`PretrainConfig` and `DistillConfig` (TORCH-FREE): every knob of `disan distill pretrain`'s two
loops, frozen, each default in this one place; `TaskTeacherConfig`, the same for `disan distill
task-teacher` (`disan.distill.task_teacher`, whose command line builds it).

The loops take them (`disan.distill.pretrain.pretrain_encoder`: `--texts`, MiniLM's vectors of
staged sentences; `disan.distill.loop.distill`: `--corpus`, a corpus's teacher cache); the command
line (`disan.distill.pretrain_cli`) builds them from its flags, whose defaults are these, and
checks the flags that go together. A run stores its config in its checkpoints as `train_config`
(`record`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from disan.data.recipes import HOLDOUT_SEED, HOLDOUT_SIZE


@dataclass(frozen=True, kw_only=True)
class EncoderRun:
    """What both loops share: the run's folder, the student's word table and size, the optimiser."""

    out: Path                           # vocab.json, best.pt, metrics.jsonl (and last.pt for --corpus)
    init: str = "glove"                 # the word table's start: glove, random or a static source
    embed_dim: int = 50                 # word vector size where --init does not fix it
    d_h: int = 300                      # hidden size of the DiSA blocks
    batch_size: int = 64
    lr: float = 1e-3                    # Adam
    max_minutes: float | None = None    # time budget; stops cleanly with a checkpoint
    threads: int | None = None          # torch CPU threads (None: torch's default)
    seed: int = 1

    def record(self) -> dict:
        """The config as a checkpoint's `train_config` (paths as strings)."""
        def plain(value):
            if isinstance(value, Path):
                return str(value)
            return [plain(v) for v in value] if isinstance(value, (list, tuple)) else value

        return {name: plain(value) for name, value in asdict(self).items()}


@dataclass(frozen=True, kw_only=True)
class PretrainConfig(EncoderRun):
    """`disan distill pretrain --texts`: a linear map from the DiSAN vector predicts MiniLM's."""

    texts: tuple[Path, ...] = ()        # training files whose sentences are distilled
    exclude: tuple[Path, ...] = ()      # files whose sentences are never used (held-out dev/test)
    holdout_from: Path | None = None    # one of `texts` whose held-out dev slice is excluded
    holdout: int = HOLDOUT_SIZE
    holdout_seed: int = HOLDOUT_SEED
    min_tokens: int = 2                 # shorter sentences are left out
    vocab: Path | None = None           # a vocab.json to use; None: texts' words + glove_extra
    glove: Path | None = None           # a GloVe/word2vec text file (None: the GloVe package)
    glove_extra: int = 30000            # frequent GloVe words added beyond the texts' own
    epochs: int = 3


@dataclass(frozen=True, kw_only=True)
class DistillConfig(EncoderRun):
    """`disan distill pretrain --corpus`: a corpus's cached teacher vectors distilled, with the
    terms and phases `disan.distill.loop` describes."""

    corpus: Path | None = None          # the `disan distill corpus` folder (recorded; the caller reads it)
    teacher: str = "mpnet"              # its cache: CORPUS/teacher-NAME
    data: Path = Path("../shared/data")  # staged data: STS dev (selection), the labelled terms' files
    vocab_size: int = 60000             # corpus words in a student from scratch's table
    serve_proj: bool = False            # the encoder ends in the map into the teacher's space
    keep_prob: float = 0.9
    contrastive: float = 0.0            # weight of in-batch InfoNCE
    temperature: float = 0.05
    relational: float = 0.0             # weight of the in-batch cosine matrices' squared error
    relational_teacher: str | None = None  # a second cache mixed into the relational target
    relational_mix: float = 0.5         # its share (0 to 1)
    whitened: float = 0.0               # weight of the cosine in the teacher's evened-out space
    whiten_power: float = 0.5
    neighbour_group: int = 0            # batches of teacher-space neighbours in groups of this many
    pairs_weight: float = 0.0           # STS-B / SICK train pairs
    pair_loss: str = "mse"              # mse | cosent
    nli_weight: float = 0.0             # NLI (premise, entailed, contradicting) triples
    sentiment_weight: float = 0.0       # a training-only head on SST-5 train phrases
    probe_first: bool = False           # that head starts at a logistic regression, not at random
    anchor: float = 0.0                 # weight of 1 - cosine to the init_from student's vector
    freeze_words: bool = False          # keep init_from's word table as it is
    distill_weight: float = 1.0         # weight of the teacher's terms (0: the anchor alone)
    init_from: Path | None = None       # a trained student's checkpoint to go on from
    steps: int = 10**9
    lr_decay: str = "none"              # none | linear | cosine, over this run's steps
    eval_every: int = 500
    resume: bool = False                # go on from out/last.pt
    device: str = "auto"                # auto | cpu | cuda[:N]


@dataclass(frozen=True, kw_only=True)
class TaskTeacherConfig:
    """`disan distill task-teacher`: a sentence-transformer fine-tuned on a sentiment recipe, then
    its logits of the recipe's training examples (`disan.distill.task_teacher`)."""

    out: Path                           # teacher.pt, teacher.json, soft.npz, ...
    recipe: str = "sst5"                # sst5 | sst2
    data: Path = Path("../shared/data")  # the staged data folder
    train_file: str | None = None       # under data; None: the recipe's sentence-level training file
    teacher: str = "mpnet"              # mpnet | minilm
    epochs: int = 3
    lr: float = 2e-5
    batch_size: int = 16
    seed: int = 0
    precision: str = "auto"             # auto | bf16 | fp32 (the command line resolves auto)
    device: str = "cpu"
    threads: int = 0                    # torch threads (0: torch's default)
    chunk: int = 8192                   # examples labelled between progress records
    log_every: int = 500                # fine-tuning steps between progress lines
    save_every: int = 500               # fine-tuning steps between saves of the whole fit
    checkpoints: tuple[str, ...] = ()   # no fine-tuning: the mean of these sentiment checkpoints
    augment: int = 0                    # new variants of each fine-tuning sentence to label
    unlabelled: str | None = None       # a `disan distill corpus` folder whose sentences to label
