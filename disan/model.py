"""DiSAN: Directional Self-Attention Network (Shen et al., AAAI 2018). The one home of model math.

Shapes: B = batch, n = tokens, d_e = embedding dim, d = d_h (hidden dim, 300 in the paper).

    x = embed(ids)                                       [B, n, d_e]
    fw = DiSA(x, forward mask),  bw = DiSA(x, backward)  [B, n, d] each    (eqs. 14-20)
    u = [fw; bw]                                         [B, n, 2d]
    u = u + gain * [fw'(u); bw'(u)]  per further layer   [B, n, 2d]        (config `layers`; not the paper)
    s = source2token(u)                                  [B, 2d]           (eqs. 12-13)

Masking never uses -inf: the multi-dimensional logits are bounded by c (c*tanh(./c)), so we
take exp(logit - c) in [e^-2c, 1] with no overflow even in fp16, multiply by the 0/1 mask and
normalise; a row with no valid position (the first token going forward, the last going
backward) gets exactly zero output instead of NaN. Unbounded logits (additive attention,
source2token) use a finite fill (-1e4, representable in fp16), softmax, then the mask.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from disan.text.tokenizer import UNK

AttentionKind = Literal["multi_dim", "additive", "coda"]
MaskKind = Literal["directional", "diag", "none"]
S2TKind = Literal["multi_dim", "additive"]
EncoderKind = Literal["disan", "multi_head", "bilstm"]
FINITE_NEG = -1.0e4  # masked-logit fill: exp() of it is 0 in fp32 and fp16, and it fits in fp16
# A task model's state key of its copy of the embedding encoder's word table (`disan borrow-words`):
# its `encoder`'s `borrowed` buffer. The export stores it as the same bytes as that table.
BORROWED_KEY = "encoder.borrowed"


@dataclass
class DiSANConfig:
    """Everything needed to rebuild a model; stored inside every checkpoint and manifest."""

    vocab_size: int
    embed_dim: int = 300          # d_e (300 with GloVe 840B, 50 with the staged GloVe 6B 50d)
    d_h: int = 300                # hidden size of each DiSA block; sentence vector is 2*d_h
    c: float = 5.0                # scale of c*tanh(./c) in the token2token logits
    activation: Literal["elu", "relu"] = "elu"
    keep_prob: float = 0.75       # dropout keep probability (paper: 0.75 SNLI, 0.7 SST)
    attention_kind: AttentionKind = "multi_dim"
    mask_kind: MaskKind = "directional"
    coda_gate: Literal["scaled", "centred"] = "scaled"  # 2*sigmoid(N), or sigmoid(N - mean_j N)
    s2t_kind: S2TKind = "multi_dim"  # source2token: a score per feature (eq. 12), or one per token
    # What turns word vectors into token vectors before source2token: the two DiSA blocks (the
    # model), or one of the paper's baselines (multi-head attention, a Bi-LSTM).
    encoder_kind: EncoderKind = "disan"
    task: Literal["nli", "sentiment", "encoder"] = "nli"
    num_classes: int = 3
    head_dim: int = 300
    # > 0: a linear map of the 2*d_h source2token vector to this size ends the encoder, so a student
    # distilled into a teacher's space (768 for MPNet) serves the vectors it was trained to match.
    proj_dim: int = 0
    # True: the head (proj_dim > 0) ends in an L2 normalisation, as sentence-transformers' Normalize
    # module: every vector it serves has length 1, so a probe on raw vectors (the transfer tasks'
    # features u * v, |u - v|) reads directions only, as a cosine does.
    unit_length: bool = False
    # > 0: ids past this model's own table read another model's word vectors (the bundle's
    # embedding encoder's table, [borrowed_rows, borrowed_dim], held as a buffer), through a
    # linear map into this model's word space (`disan borrow-words`), instead of as UNK.
    borrowed_rows: int = 0
    borrowed_dim: int = 0
    # Where borrowed row 0 sits in the model's ids. 0 for a task model: its ids are the bundle
    # vocabulary's, which lists its own words first, so id i past its table reads row i. A piece
    # encoder that reads whole words through the bundle's word table (`disan distill whole-words`)
    # has its own table's size here: id i past its pieces reads word row i - borrowed_offset.
    borrowed_offset: int = 0
    # > 1 (sentiment): an ensemble of this many models trained apart over one frozen word table
    # (`disan train --freeze-words`, joined by `disan ensemble`); see SentimentModel.
    members: int = 1
    # > 1 (a directional DiSAN): more directional layers over the first one's token vectors u, each
    # added to what it reads with a per-feature gain that starts at 0 (`ResidualLayer`), so a deeper
    # student grown from a trained one starts with that one's vectors
    layers: int = 1

    @property
    def out_dim(self) -> int:
        """The encoder's sentence vector: 2*d_h, or proj_dim where a projection follows."""
        return self.proj_dim or 2 * self.d_h

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DiSANConfig:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def elu(x: Tensor) -> Tensor:
    """ELU (alpha 1) as relu(x) + exp(min(x, 0)) - 1: the same values as F.elu (within 1e-7), but
    it exports to ONNX ops that onnxruntime vectorises (its own Elu kernel is slower)."""
    return F.relu(x) + (torch.exp(torch.clamp(x, max=0.0)) - 1.0)


class Dense(nn.Module):
    """dropout -> linear -> activation: the reference's `bn_dense_layer` (dropout on the input)."""

    def __init__(self, d_in: int, d_out: int, activation: str | None, keep_prob: float, bias=True):
        super().__init__()
        self.drop = nn.Dropout(1.0 - keep_prob)
        self.linear = nn.Linear(d_in, d_out, bias=bias)
        self.act = {"elu": elu, "relu": F.relu, None: lambda t: t}[activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.linear(self.drop(x)))


def pair_mask(mask: Tensor, kind: str, direction: str) -> Tensor:
    """[B, n, n] bool: may token i (row) attend to token j (column)?

    forward: j < i; backward: j > i; diag: j != i. Padding columns are always masked.
    """
    n = mask.shape[1]
    idx = torch.arange(n, device=mask.device)
    rows, cols = idx[:, None], idx[None, :]
    if kind == "diag":
        allowed = rows != cols
    elif direction == "forward":
        allowed = cols < rows
    else:
        allowed = cols > rows
    return allowed[None, :, :] & mask[:, None, :]


def masked_softmax(logits: Tensor, mask: Tensor, dim: int) -> Tensor:
    """Softmax over `dim` with masked entries exactly 0 (finite fill, no -inf, no NaN)."""
    probs = torch.softmax(logits.masked_fill(~mask, FINITE_NEG), dim=dim)
    return probs * mask.to(probs.dtype)


class DiSA(nn.Module):
    """One directional self-attention block (eqs. 14-20) for a fixed mask direction."""

    def __init__(self, cfg: DiSANConfig, direction: str):
        super().__init__()
        d, kp = cfg.d_h, cfg.keep_prob
        self.cfg, self.direction = cfg, direction
        self.map = Dense(cfg.embed_dim, d, cfg.activation, kp)            # h = σ(W_h x + b_h)
        self.drop = nn.Dropout(1.0 - kp)
        self.w1 = nn.Linear(d, d, bias=False)                             # W(1) h_i  (query side)
        self.w2 = nn.Linear(d, d, bias=False)                             # W(2) h_j  (key side)
        self.b1 = nn.Parameter(torch.zeros(d))
        if cfg.attention_kind == "additive":
            self.score = nn.Linear(d, 1, bias=False)                     # token-wise: w^T σ(.)
        if cfg.attention_kind == "coda":
            self.n1 = nn.Linear(d, d, bias=False)                         # N = -|W3 h_i - W4 h_j|
            self.n2 = nn.Linear(d, d, bias=False)
        self.gate_s = Dense(d, d, None, kp)                               # W(f1) s + b(f)
        self.gate_h = Dense(d, d, None, kp, bias=False)                   # W(f2) h

    def project(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [B,n,d_e] -> (h, dropout(h)) [B,n,d] each: eq. 14's token representations."""
        h = self.map(x)
        return h, self.drop(h)

    def scaled_logit_terms(self, hd: Tensor) -> tuple[Tensor, Tensor]:
        """Query and key terms of the multi-dim logits, pre-scaled by -2/c: [B,n,d] each.

        eq. 15 logits c*tanh(y/c) with y = W1 h_i + W2 h_j + b, shifted by their bound c:
            c*tanh(y/c) - c == -2c * sigmoid(-2y/c)
        The shift cancels in the normalisation and keeps exp() in [e^-2c, 1] (no overflow in
        fp16); the -2/c scale folds into these small [B,n,d] projections, so the big [B,n,n,d]
        tensor sees only add, sigmoid, scale, exp.
        """
        scale = -2.0 / self.cfg.c
        return (self.w1(hd) + self.b1) * scale, self.w2(hd) * scale

    def fuse(self, h: Tensor, s: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Fusion gate (eqs. 19-20): (u [B,n,d] with padding rows 0, gate [B,n,d])."""
        gate = torch.sigmoid(self.gate_s(s) + self.gate_h(h))
        return (gate * h + (1.0 - gate) * s) * mask[..., None].to(h.dtype), gate

    def forward(self, x: Tensor, mask: Tensor, need_attention: bool = False
                ) -> tuple[Tensor, Tensor | None, Tensor]:
        """x [B,n,d_e], mask [B,n] -> (u [B,n,d], attention averaged over features [B,n,n] if
        `need_attention` else None, fusion gate [B,n,d])."""
        cfg = self.cfg
        h, hd = self.project(x)                                           # [B,n,d]
        pm = pair_mask(mask, cfg.mask_kind, self.direction)              # [B,n,n]
        m4 = pm[..., None].to(h.dtype)                                    # [B,n,n,1]
        if cfg.attention_kind == "multi_dim":
            q, k = self.scaled_logit_terms(hd)
            weights = torch.exp(torch.sigmoid(q[:, :, None, :] + k[:, None, :, :]) * (-2.0 * cfg.c))
            # Masked sums over j as batched mat-vecs ([B,n,1,n] @ [B,n,n,d]): the 0/1 mask row
            # removes masked j exactly, with no separate full-size mask multiply.
            row_mask = pm[:, :, None, :].to(h.dtype)                      # [B,n,1,n]
            empty = (~pm.any(dim=2))[..., None].to(h.dtype)              # [B,n,1]: rows with no valid j
            denom = (row_mask @ weights).squeeze(2) + empty               # [B,n,d]
            s = (row_mask @ (weights * h[:, None, :, :])).squeeze(2) / denom  # eq. 16: [B,n,d]
            attn = ((weights * m4) / denom[:, :, None, :]).mean(dim=-1) if need_attention else None
        else:
            pre = self.w1(hd)[:, :, None, :] + self.w2(hd)[:, None, :, :] + self.b1  # [B,n,n,d]
            if cfg.attention_kind == "additive":
                scores = self.score(torch.tanh(pre)).squeeze(-1)          # [B,n,n]
                probs = masked_softmax(scores, pm, dim=2)[..., None]      # [B,n,n,1]
            else:  # coda: tanh(E) * gate(N), no softmax
                dist = -(self.n1(hd)[:, :, None, :] - self.n2(hd)[:, None, :, :]).abs()  # [B,n,n,d]
                if cfg.coda_gate == "scaled":
                    gate = 2.0 * torch.sigmoid(dist)
                else:
                    count = m4.sum(dim=2, keepdim=True).clamp_min(1.0)
                    gate = torch.sigmoid(dist - (dist * m4).sum(dim=2, keepdim=True) / count)
                probs = torch.tanh(pre) * gate * m4
            s = (probs * h[:, None, :, :]).sum(dim=2)                     # eq. 16: [B,n,d]
            attn = probs.mean(dim=-1) if need_attention else None
        u, fuse = self.fuse(h, s, mask)
        return u, attn, fuse


def _pair_rows(qs: Tensor, ks: Tensor, hs: Tensor, mask: Tensor, c: float, rows: Tensor
               ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """eq. 16 of both directions for the query positions `rows` [r] of the packed pair tensor.

    qs, ks, hs [B,2n,d]: the forward block's query terms, key terms and h stacked over the
    backward block's along the token axis; mask [B,n]. Returns (s [B,r,2,d], weights [B,r,n,d],
    denom [B,r,2,d], the rows' 0/1 forward and backward masks [B,r,2,n]).
    """
    B, n = mask.shape
    d = qs.shape[2]
    r = rows.shape[0]
    idx = torch.arange(n, device=mask.device)
    lower = idx[None, :] < rows[:, None]                                  # [r,n]: j < i (forward)
    # Row i, column j reads the forward block's terms below the diagonal and the backward
    # block's on and above it: gathers from the stacked [fw; bw] rows (plain row copies;
    # onnxruntime's broadcasting Where is slower than Add on this shape).
    q_src = torch.where(lower, rows[:, None], rows[:, None] + n).reshape(-1)  # [r*n]
    k_src = torch.where(lower, idx[None, :], idx[None, :] + n).reshape(-1)    # [r*n]
    z = qs.index_select(1, q_src).reshape(B, r, n, d) + ks.index_select(1, k_src).reshape(B, r, n, d)
    weights = torch.exp(torch.sigmoid(z) * (-2.0 * c))                    # [B,r,n,d], unmasked
    values = hs.index_select(1, k_src).reshape(B, r, n, d)                # h_j of each pair's block
    pm_f = lower[None] & mask[:, None, :]                                 # [B,r,n]
    pm_b = (idx[None, :] > rows[:, None])[None] & mask[:, None, :]
    masks = torch.stack([pm_f, pm_b], dim=2).to(qs.dtype)                 # [B,r,2,n]
    empty = (masks.sum(dim=3) == 0).to(qs.dtype)[..., None]               # [B,r,2,1]: no valid j
    denom = masks @ weights + empty                                       # [B,r,2,d]
    return (masks @ (weights * values)) / denom, weights, denom, masks


def _pair_rows_in_chunks(qs: Tensor, ks: Tensor, hs: Tensor, mask: Tensor, c: float,
                         chunk_cells: int) -> Tensor:
    """`_pair_rows` for all n rows, in steps of at most ~`chunk_cells` (batch x rows x n) pairs.

    A `scan` over query-row chunks (an ONNX Scan: one loop for every n) keeps each step's
    [B,r,n,d] intermediates cache-sized. Chunk sizes are balanced, so a short batch runs in one
    step with no padding; the last chunk repeats row n-1 to fill up and those rows are dropped.
    """
    from torch._higher_order_ops.scan import scan  # a higher-order op: exports as a loop

    B, n = mask.shape
    steps = (B * n * n + chunk_cells - 1) // chunk_cells
    per = (n + steps - 1) // steps                                        # rows per step
    steps = (n + per - 1) // per
    rows = torch.arange(steps * per, device=mask.device).clamp(max=n - 1).reshape(steps, per)

    def step(carry: Tensor, chunk: Tensor) -> tuple[Tensor, Tensor]:
        return carry.clone(), _pair_rows(qs, ks, hs, mask, c, chunk)[0]

    _, parts = scan(step, qs.new_zeros(1), rows)                          # [steps,B,per,2,d]
    return parts.transpose(0, 1).reshape(B, steps * per, 2, qs.shape[2])[:, :n]


def directional_pair(fw: DiSA, bw: DiSA, x: Tensor, mask: Tensor, need_attention: bool = False,
                     chunk_cells: int = 0
                     ) -> tuple[tuple[Tensor, Tensor | None, Tensor], tuple[Tensor, Tensor | None, Tensor]]:
    """Both multi-dim directional blocks in ONE [B,n,n,d] tensor: `(fw(x), bw(x))`, same values.

    The forward mask keeps pairs j < i and the backward mask j > i: complementary triangles. So
    the lower triangle holds the forward block's logits and the upper triangle the backward
    block's, and the expensive sigmoid/exp run over n*n pairs once instead of twice (the
    diagonal is masked in both). Each direction then sums its own triangle with a 0/1 row mask,
    both in one batched mat-vec ([B,n,2,n] @ [B,n,n,d]). `chunk_cells` > 0 computes the rows in
    cache-sized chunks (`_pair_rows_in_chunks`; not with `need_attention`).
    """
    c = fw.cfg.c
    n = mask.shape[1]
    h_f, hd_f = fw.project(x)                                             # [B,n,d]
    h_b, hd_b = bw.project(x)
    q_f, k_f = fw.scaled_logit_terms(hd_f)
    q_b, k_b = bw.scaled_logit_terms(hd_b)
    qs, ks, hs = (torch.cat(pair, dim=1) for pair in ((q_f, q_b), (k_f, k_b), (h_f, h_b)))  # [B,2n,d]
    a_f = a_b = None
    if chunk_cells > 0 and not need_attention:
        s = _pair_rows_in_chunks(qs, ks, hs, mask, c, chunk_cells)       # [B,n,2,d]
    else:
        idx = torch.arange(n, device=mask.device)
        s, weights, denom, masks = _pair_rows(qs, ks, hs, mask, c, idx)
        if need_attention:
            low4 = (idx[None, :] < idx[:, None])[:, :, None]
            probs = weights / torch.where(low4, denom[:, :, 0:1, :], denom[:, :, 1:2, :])  # [B,n,n,d]
            mean = probs.mean(dim=-1)                                     # [B,n,n]
            a_f, a_b = mean * masks[:, :, 0], mean * masks[:, :, 1]
    u_f, g_f = fw.fuse(h_f, s[:, :, 0], mask)
    u_b, g_b = bw.fuse(h_b, s[:, :, 1], mask)
    return (u_f, a_f, g_f), (u_b, a_b, g_b)


class ResidualLayer(nn.Module):
    """A further directional layer (`DiSANConfig.layers`): a forward and a backward DiSA block over
    the layer below's token vectors u [B,n,2d], u + gain * [fw(u); bw(u)]. The gain starts at 0: the
    layer first passes u through unchanged, and learns how much to add."""

    def __init__(self, cfg: DiSANConfig):
        super().__init__()
        inner = replace(cfg, embed_dim=2 * cfg.d_h)
        self.fw, self.bw = DiSA(inner, "forward"), DiSA(inner, "backward")
        self.gain = nn.Parameter(torch.zeros(2 * cfg.d_h))

    def forward(self, u: Tensor, mask: Tensor, packed: bool, chunk_cells: int) -> Tensor:
        if packed:
            (u_fw, _, _), (u_bw, _, _) = directional_pair(self.fw, self.bw, u, mask, chunk_cells=chunk_cells)
        else:
            u_fw, u_bw = self.fw(u, mask)[0], self.bw(u, mask)[0]
        return u + self.gain * torch.cat([u_fw, u_bw], dim=-1)


class Source2Token(nn.Module):
    """Source2token attention [B,n,D] -> [B,D]: multi-dimensional (eqs. 12-13, one weight per
    feature), or `s2t_kind="additive"`: the traditional additive attention, one weight per token
    (the paper's "word embedding + additive attention" ablation row)."""

    def __init__(self, dim: int, cfg: DiSANConfig):
        super().__init__()
        self.map1 = Dense(dim, dim, cfg.activation, cfg.keep_prob)
        self.map2 = Dense(dim, dim if cfg.s2t_kind == "multi_dim" else 1, None, cfg.keep_prob)

    def forward(self, u: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.map2(self.map1(u))                                  # [B,n,D] (additive: [B,n,1])
        probs = masked_softmax(logits, mask[..., None], dim=1)          # mask broadcast, not tiled
        return (probs * u).sum(dim=1), probs                              # [B,D], [B,n,D or 1]


def sinusoid_positions(n: int, dim: int, device) -> Tensor:
    """[n, dim] sinusoidal position encodings (Vaswani et al., 2017): sin on even, cos on odd features."""
    pos = torch.arange(n, device=device, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(1e4) / dim))
    table = torch.zeros(n, dim, device=device)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return table


class MultiHeadContext(nn.Module):
    """Baseline "multi-head + source2token": scaled dot-product multi-head self-attention
    (Vaswani et al., 2017) over position-encoded token vectors: [B,n,d_e] -> [B,n,2d_h].

    Heads: as many as divide 2*d_h, up to 8 (75 units each at the paper's d_h 300 and 150).
    """

    def __init__(self, cfg: DiSANConfig):
        super().__init__()
        dim = 2 * cfg.d_h
        self.heads = math.gcd(dim, 8)
        self.map = Dense(cfg.embed_dim, dim, cfg.activation, cfg.keep_prob)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = Dense(dim, dim, None, cfg.keep_prob)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        B, n, _ = x.shape
        h = self.map(x)
        h = h + sinusoid_positions(n, h.shape[-1], x.device).to(h.dtype)
        q, k, v = (t.reshape(B, n, self.heads, -1).transpose(1, 2) for t in self.qkv(h).chunk(3, dim=-1))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])         # [B,heads,n,n]
        probs = masked_softmax(scores, mask[:, None, None, :], dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(B, n, -1)               # [B,n,2d]
        return self.out(ctx) * mask[..., None].to(h.dtype)


class BiLSTMContext(nn.Module):
    """Baseline "Bi-LSTM + source2token": a one-layer bidirectional LSTM, d_h per direction,
    run on the packed valid tokens (padding never enters the recurrence): [B,n,d_e] -> [B,n,2d_h]."""

    def __init__(self, cfg: DiSANConfig):
        super().__init__()
        self.drop = nn.Dropout(1.0 - cfg.keep_prob)
        self.lstm = nn.LSTM(cfg.embed_dim, cfg.d_h, batch_first=True, bidirectional=True)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        n = x.shape[1]
        lengths = mask.sum(dim=1).clamp_min(1).cpu()                       # an empty row runs 1 step
        packed = nn.utils.rnn.pack_padded_sequence(self.drop(x), lengths, batch_first=True,
                                                   enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=n)
        return out * mask[..., None].to(out.dtype)


def pooled_without_each(u: Tensor, probs: Tensor, mask: Tensor) -> Tensor:
    """Source2token pooling with each token left out in turn: [B,n,D] from u [B,n,D] and the
    source2token weights probs [B,n,D] (or [B,n,1], additive).

    Row i is the sentence vector had token i been masked out of the source2token softmax (the
    token vectors u held fixed): sum_{j!=i} p_j u_j / sum_{j!=i} p_j per feature. Both sums are
    mat-muls with an off-diagonal 0/1 matrix, so nothing is subtracted (a (s - p_i u_i) / (1 - p_i)
    shortcut cancels badly in fp16 when one token dominates a feature). A one-token sentence
    has nothing left: its row is 0, like the vector of an empty sentence.
    """
    n = mask.shape[1]
    idx = torch.arange(n, device=mask.device)
    others = ((idx[:, None] != idx[None, :])[None] & mask[:, None, :]).to(u.dtype)  # [B,n,n]
    num = others @ (probs * u)
    den = others @ probs
    return num / (den + (den == 0).to(u.dtype))


class DiSANEncoder(nn.Module):
    """Token ids -> 2*d_h sentence vector."""

    def __init__(self, cfg: DiSANConfig):
        super().__init__()
        self.cfg = cfg
        # vocab_size 0: no table of its own; it reads the word vectors it is given (`read`), as
        # an ensemble's later members read the first member's.
        self.embed = nn.Embedding(cfg.vocab_size, cfg.embed_dim, padding_idx=0) if cfg.vocab_size else None
        if self.embed is not None:
            # Rows set False here (words only in GloVe) get zero gradient: they stay pre-trained.
            self.register_buffer("trainable_rows", torch.ones(cfg.vocab_size, dtype=torch.bool))
            self.embed.weight.register_hook(lambda g: g * self.trainable_rows[:, None].to(g.dtype))
        self.borrow_map = None
        if cfg.borrowed_rows > 0:
            self.register_buffer("borrowed", torch.zeros(cfg.borrowed_rows, cfg.borrowed_dim))
            self.borrow_map = nn.Linear(cfg.borrowed_dim, cfg.embed_dim)
        if cfg.encoder_kind == "multi_head":
            self.context = MultiHeadContext(cfg)
        elif cfg.encoder_kind == "bilstm":
            self.context = BiLSTMContext(cfg)
        elif cfg.mask_kind == "none":  # ablation: word embedding + source2token only
            self.token_map = Dense(cfg.embed_dim, 2 * cfg.d_h, cfg.activation, cfg.keep_prob)
        else:
            direction_b = "backward" if cfg.mask_kind == "directional" else "diag"
            self.fw = DiSA(cfg, "forward" if cfg.mask_kind == "directional" else "diag")
            self.bw = DiSA(cfg, direction_b)
        if cfg.layers > 1 and (cfg.encoder_kind != "disan" or cfg.mask_kind != "directional"):
            raise ValueError(f"layers={cfg.layers}: further layers are directional DiSA blocks; "
                             f"{cfg.encoder_kind}/{cfg.mask_kind} has none")
        self.upper = nn.ModuleList(ResidualLayer(cfg) for _ in range(cfg.layers - 1))
        self.s2t = Source2Token(2 * cfg.d_h, cfg)
        self.proj = nn.Linear(2 * cfg.d_h, cfg.proj_dim) if cfg.proj_dim > 0 else None
        if cfg.unit_length and self.proj is None:
            raise ValueError("unit_length: the normalisation ends the head, and proj_dim 0 has none")
        # Both directions in one n x n tensor (same values; see directional_pair). A plain
        # attribute, not config: tests switch it off to compare against the per-block path.
        self.packed = (cfg.encoder_kind == "disan" and cfg.mask_kind == "directional"
                       and cfg.attention_kind == "multi_dim")
        # Query-row chunking of the packed attention (0: off). The exporter turns it on (see
        # model_export.graphs.wrappers.ATTENTION_CHUNK_CELLS); training and eager inference leave it off.
        self.chunk_cells = 0

    @property
    def out_dim(self) -> int:
        return self.cfg.out_dim

    def word_vectors(self, ids: Tensor) -> Tensor:
        """ids [B,n] -> the word vectors the encoder reads [B,n,d_e]."""
        # An id past this model's table is a word it never saw: one bundle vocabulary can extend a
        # model's own with another model's words (appended), and those read as UNK here, or as
        # the mapped row of the table it borrows where it borrows one.
        own = ids < self.embed.num_embeddings                             # [B,n]
        x = self.embed(torch.where(own, ids, UNK))                        # [B,n,d_e]
        if self.borrow_map is None:
            return x
        # Only the few tokens that borrow are mapped (in the graph: NonZero, Gather, ScatterND),
        # not every token, so a text with none pays almost nothing for the map.
        off = self.cfg.borrowed_offset
        lent = ~own & (ids < off + self.borrowed.shape[0])                # [B,n]
        at = lent.flatten().nonzero().squeeze(1)                          # [K] flat positions
        rows = ids.flatten()[at] - off if off else ids.flatten()[at]      # (0: the graph as before)
        far = self.borrow_map(F.embedding(rows, self.borrowed))           # [K,d_e]
        return x.flatten(0, 1).index_put((at,), far).view(x.shape)        # [B,n,d_e]

    def forward(self, ids: Tensor, mask: Tensor, return_tokens: bool = False):
        """ids [B,n] int64, mask [B,n] bool -> sentence vector [B, out_dim] (2*d_h unless proj_dim).

        With `return_tokens=True` also returns the token-level dict of `read`."""
        return self.read(self.word_vectors(ids), mask, return_tokens)

    def read(self, x: Tensor, mask: Tensor, return_tokens: bool = False):
        """Word vectors x [B,n,d_e], mask [B,n] bool -> sentence vector [B, out_dim].

        With `return_tokens=True` also returns a dict with u_fw, u_bw [B,n,d_h]; attn_fw,
        attn_bw [B,n,n] (attention averaged over features); gate_fw, gate_bw [B,n,d_h]
        (fusion gates); s2t [B,n] (source2token weights averaged over features); u [B,n,2*d_h]
        and s2t_probs [B,n,2*d_h] (per-feature source2token weights; [B,n,1] if additive).
        """
        extras: dict[str, Tensor] = {}
        if self.cfg.encoder_kind != "disan":
            u = self.context(x, mask)                                     # [B,n,2d]
        elif self.cfg.mask_kind == "none":
            u = self.token_map(x) * mask[..., None].to(x.dtype)           # [B,n,2d]
        else:
            if self.packed:
                (u_fw, a_fw, g_fw), (u_bw, a_bw, g_bw) = directional_pair(
                    self.fw, self.bw, x, mask, need_attention=return_tokens, chunk_cells=self.chunk_cells)
            else:
                u_fw, a_fw, g_fw = self.fw(x, mask, need_attention=return_tokens)
                u_bw, a_bw, g_bw = self.bw(x, mask, need_attention=return_tokens)
            u = torch.cat([u_fw, u_bw], dim=-1)                           # [B,n,2d]
            for layer in self.upper:  # the token-level extras below stay the first layer's
                u = layer(u, mask, self.packed, self.chunk_cells)        # [B,n,2d]
            extras = {"u_fw": u_fw, "u_bw": u_bw, "attn_fw": a_fw, "attn_bw": a_bw,
                      "gate_fw": g_fw, "gate_bw": g_bw}
        sent, probs = self.s2t(u, mask)                                   # [B,2d]
        if self.proj is not None:  # the head; fitting it (distill.student.starts) reads the vector before it
            sent = self.proj(sent)                                        # [B,proj_dim]
            if self.cfg.unit_length:
                sent = F.normalize(sent, dim=-1)
        if not return_tokens:
            return sent
        extras["s2t"] = probs.mean(dim=-1)
        extras["u"], extras["s2t_probs"] = u, probs                       # [B,n,2d], [B,n,2d or 1]
        return sent, extras

    def decay_parameters(self) -> list[nn.Parameter]:
        """Weight matrices that get L2 decay: not biases, not the embedding."""
        return [p for name, p in self.named_parameters() if p.ndim >= 2 and not name.startswith("embed.")]


class NLIModel(nn.Module):
    """Shared encoder for premise u and hypothesis v; [u; v; u-v; u*v] -> 300 ELU -> classes."""

    def __init__(self, cfg: DiSANConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = DiSANEncoder(cfg)
        d = self.encoder.out_dim
        self.hidden = Dense(4 * d, cfg.head_dim, "elu", cfg.keep_prob)
        self.out = Dense(cfg.head_dim, cfg.num_classes, None, cfg.keep_prob)

    def forward(self, p_ids: Tensor, p_mask: Tensor, h_ids: Tensor, h_mask: Tensor) -> Tensor:
        """-> logits [B, num_classes]."""
        return self.classify(self.encoder(p_ids, p_mask), self.encoder(h_ids, h_mask))

    def classify(self, u: Tensor, v: Tensor) -> Tensor:
        """The head alone: premise and hypothesis vectors [B,2d] each -> logits [B, num_classes]."""
        return self.out(self.hidden(torch.cat([u, v, u - v, u * v], dim=-1)))

    def decay_parameters(self) -> list[nn.Parameter]:
        return self.encoder.decay_parameters() + [self.hidden.linear.weight, self.out.linear.weight]


class SentimentModel(nn.Module):
    """Encoder -> 300 ELU -> classes (5 for SST-5).

    With cfg.members = K > 1 it is an ensemble: K - 1 more encoder + head pairs (`others`, without
    word tables) read the word vectors of this model's encoder, and the class probabilities are
    the mean of the K models'. The members were trained apart over one frozen table, so it is
    stored once and the ensemble reads a text's words once.
    """

    def __init__(self, cfg: DiSANConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = DiSANEncoder(cfg)
        self.hidden = Dense(self.encoder.out_dim, cfg.head_dim, "elu", cfg.keep_prob)
        self.out = Dense(cfg.head_dim, cfg.num_classes, None, cfg.keep_prob)
        member = replace(cfg, vocab_size=0, borrowed_rows=0, borrowed_dim=0, members=1)
        self.others = nn.ModuleList(SentimentModel(member) for _ in range(cfg.members - 1))

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        """-> logits [B, num_classes] (an ensemble's: log of the mean probability)."""
        if not self.others:
            return self.classify(self.encoder(ids, mask))
        return mean_probability(self.member_logits(ids, mask))

    def classify(self, sent: Tensor) -> Tensor:
        """The head alone: sentence vector [B,2d] -> logits [B, num_classes]."""
        return self.out(self.hidden(sent))

    def members(self) -> list[SentimentModel]:
        return [self, *self.others]

    def member_logits(self, ids: Tensor, mask: Tensor) -> list[Tensor]:
        """Each member's logits [B, num_classes] (this model's first; one for a single model)."""
        return [m.classify(sent) for m, sent in self._read(ids, mask, return_tokens=False)]

    def _read(self, ids: Tensor, mask: Tensor, return_tokens: bool) -> list[tuple[SentimentModel, Any]]:
        """(member, its encoder's output) for every member: the words are looked up once, by this
        model's encoder (its borrowed words included), and every member reads those vectors."""
        x = self.encoder.word_vectors(ids)                                # [B,n,d_e]
        return [(m, m.encoder.read(x, mask, return_tokens)) for m in self.members()]

    def explain(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """-> logits [B, num_classes] and the encoder's token-level dict (DiSANEncoder.read).

        For an ensemble the display summaries (attention maps, gates, source2token weights) are
        the members' means, and only those are returned."""
        if not self.others:
            sent, ex = self.encoder(ids, mask, return_tokens=True)
            return self.classify(sent), ex
        runs = self._read(ids, mask, return_tokens=True)
        logits = mean_probability([m.classify(sent) for m, (sent, _) in runs])
        shown = ("attn_fw", "attn_bw", "gate_fw", "gate_bw", "s2t")
        return logits, {k: torch.stack([ex[k] for _, (_, ex) in runs]).mean(dim=0) for k in shown}

    def decay_parameters(self) -> list[nn.Parameter]:
        own = self.encoder.decay_parameters() + [self.hidden.linear.weight, self.out.linear.weight]
        return own + [p for m in self.others for p in m.decay_parameters()]


def mean_probability(logits: list[Tensor]) -> Tensor:
    """K logit tensors [B,C] -> logits [B,C] whose softmax is the mean of their K softmaxes."""
    log_probs = torch.stack([F.log_softmax(z, dim=-1) for z in logits])  # [K,B,C]
    return torch.logsumexp(log_probs, dim=0) - math.log(len(logits))


def build_model(cfg: DiSANConfig) -> nn.Module:
    """The model for `cfg.task` (nli -> NLIModel, sentiment -> SentimentModel, encoder -> DiSANEncoder)."""
    return {"nli": NLIModel, "sentiment": SentimentModel, "encoder": DiSANEncoder}[cfg.task](cfg)
