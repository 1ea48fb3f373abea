"""Where a student run starts: its tokenizer (`run_tokenizer`), an earlier student's weights
(`--init`, checked by `refuse_another_start`), the projection fitted to the teacher (`fit_head`),
blocks that read the table as a static encoder does (`read_as_static`, `--static-start`) and targets
that keep part of the start's own vectors (`start_vectors`, `anchored`, `--anchor`)."""

from __future__ import annotations

import numpy as np
import torch

from disan.distill.student.config import StudentConfig
from disan.distill.student.rows import PieceRows
from disan.distill.teacher import teacher_tokenizer_file
from disan.model import DiSANConfig, DiSANEncoder
from disan.text.pieces import PieceTokenizer


@torch.no_grad()
def fit_head(encoder: DiSANEncoder, rows: PieceRows, target: np.ndarray, chosen: np.ndarray,
             cfg: StudentConfig, ridge: float = 1e-3) -> None:
    """Set `encoder.proj` to the ridge-regression map from the encoder's own vectors (before the
    projection) of `chosen` rows to the teacher's vectors of them."""
    was, proj = encoder.training, encoder.proj
    encoder.eval()
    encoder.proj = None
    try:
        feats = rows.encode_all(encoder, chosen, cfg.device, cfg.length_buckets).double()
    finally:
        encoder.proj = proj
    x = torch.cat([feats, torch.ones(len(feats), 1, dtype=feats.dtype, device=feats.device)], 1)
    y = torch.from_numpy(target[chosen]).double().to(x.device)
    gram = x.T @ x
    gram += ridge * gram.diagonal().mean() * torch.eye(len(gram), dtype=gram.dtype, device=gram.device)
    w = torch.linalg.solve(gram, x.T @ y)
    proj.weight.copy_(w[:-1].T.float())
    proj.bias.copy_(w[-1].float())
    encoder.train(was)


@torch.no_grad()
def read_as_static(encoder: DiSANEncoder, shift: float = 4.0, gate: float = 3.0) -> None:
    """Set a fresh encoder's blocks so that its vector (before the projection) is, up to dropout and
    the little the fusion gate lets through, a linear map of the mean of its table's rows of a
    text: the two directions' maps are the halves of one orthogonal map, shifted by `shift` times the
    table's RMS so that ELU is linear where the rows lie; the fusion gate's bias keeps mostly h;
    source2token starts uniform (zero logits). Training then starts where a static encoder is."""
    cfg = encoder.cfg
    if cfg.encoder_kind != "disan" or cfg.mask_kind != "directional":
        raise ValueError("--static-start sets a directional DiSAN's blocks")
    both = torch.empty(2 * cfg.d_h, cfg.embed_dim)
    torch.nn.init.orthogonal_(both)
    rms = encoder.embed.weight[1:].pow(2).mean().sqrt()  # row 0 is PAD
    for block, part in ((encoder.fw, both[:cfg.d_h]), (encoder.bw, both[cfg.d_h:])):
        block.map.linear.weight.copy_(part)
        block.map.linear.bias.fill_(shift * rms)
        block.gate_s.linear.bias.fill_(gate)
    encoder.s2t.map2.linear.weight.zero_()
    encoder.s2t.map2.linear.bias.zero_()


@torch.no_grad()
def start_vectors(encoder: DiSANEncoder | None, rows: PieceRows, done: int, cfg: StudentConfig) -> np.ndarray:
    """The --init student's own vectors of the first `done` rows [done, proj_dim], written to
    OUT/anchor.f16.npy. A resumed run (`encoder` None: its weights have moved) reads that file; a new
    run always computes them, so a file left by another start is never read as this one's."""
    path = cfg.out / "anchor.f16.npy"
    if encoder is None:
        cached = np.load(path) if path.is_file() else None
        if cached is None or len(cached) != done:
            raise ValueError(f"--resume with --anchor: {path} does not hold the start's vectors "
                             f"of {done} rows")
        return cached.astype(np.float32)
    was = encoder.training
    encoder.eval()
    own = rows.encode_all(encoder, np.arange(done), cfg.device, cfg.length_buckets, chunk=1024)
    encoder.train(was)
    vectors = own.float().cpu().numpy()
    cfg.out.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors.astype(np.float16))
    return vectors


def anchored(target: np.ndarray | None, own: np.ndarray, share: float) -> np.ndarray:
    """Unit targets `share` of the way from the teacher's direction to the start's own (the start's
    own alone where no teacher was read)."""
    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    if target is None:
        return unit(own).astype(np.float32)
    return unit((1.0 - share) * unit(target) + share * unit(own)).astype(np.float32)


def whitening_map(init: dict, path: object) -> dict:
    """The --init student's whitening map ({"mean", "linear"}), which --whiten-targets needs;
    ValueError naming what writes one where the start has none (a bundle's recovered encoder)."""
    whitening = init.get("whitening")
    if whitening is None:
        raise ValueError(f"--whiten-targets: {path} carries no whitening map (research.whiten_head writes "
                         "one, and research.whitening_power --write from a bundle's recovered encoders)")
    return whitening


def whitened_targets(target: np.ndarray, init: dict, path: object) -> np.ndarray:
    """The teacher's vectors through the map `research.whiten_head` folded into the --init
    student's head: its head's output approximates the teacher's vector, so the map sends the
    teacher into the coordinates the student now serves, where the loss weighs the quiet
    directions the whitening lifted as much as the loud ones."""
    whitening = whitening_map(init, path)
    mean, linear = whitening["mean"].double().numpy(), whitening["linear"].double().numpy()
    return ((target - mean) @ linear.T).astype(np.float32)


def load_start(encoder: DiSANEncoder, ckpt: dict) -> None:
    """The --init student's weights into `encoder`; layers it lacks (a run with more `layers`) keep
    their pass-through start (gain 0), so the grown student serves the start's vectors."""
    missing, unexpected = encoder.load_state_dict(ckpt["model_state"], strict=False)
    grown = [k for k in missing if k.startswith("upper.")]
    if unexpected or len(grown) != len(missing):
        raise ValueError(f"--init: weights that do not fit this student: "
                         f"{', '.join(sorted(set(missing) - set(grown)) + sorted(unexpected))}")


def run_tokenizer(cfg: StudentConfig, init: dict | None) -> PieceTokenizer:
    """The run's tokenizer: --tokenizer, else the --init student's own (whole words too, after
    `disan distill whole-words`), else the teacher's WordPiece."""
    if cfg.tokenizer is not None:
        return PieceTokenizer.from_file(cfg.tokenizer)
    if init is not None and init.get("tokenizer"):
        return PieceTokenizer.from_str(init["tokenizer"])
    return PieceTokenizer.from_file(teacher_tokenizer_file())


def refuse_another_start(cfg: StudentConfig, model_cfg: DiSANConfig, tok: PieceTokenizer,
                         ckpt: dict) -> None:
    """ValueError where the --init checkpoint `ckpt` is not a start of this run: another shape,
    tokenizer or target space (a turned teacher's coordinates are not the teacher's own); the
    dropout rate may differ, a setting of training rather than of the weights, and the run may have
    more layers than the start (`load_start` grows it)."""
    trained = ckpt.get("train_config", {})
    mine = {k: v for k, v in model_cfg.to_dict().items() if k not in ("keep_prob", "layers")}
    problems = [k for k, v in mine.items() if ckpt["config"].get(k) != v]
    problems += ["layers"] if ckpt["config"].get("layers", 1) > model_cfg.layers else []
    problems += ["tokenizer"] if ckpt.get("tokenizer") != tok.to_str() else []
    problems += ["rotate_teacher"] if trained.get("rotate_teacher", False) != cfg.rotate_teacher else []
    if problems:
        raise ValueError(f"--init: {cfg.init} differs from this run in {', '.join(problems)}")

