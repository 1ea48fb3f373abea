"""DiSAN model: directionality, padding, finiteness, equations 12-20 against loop code, sizes."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)  # tiny tensors: threads only add overhead on a shared CPU
F = torch.nn.functional

from disan.model import DiSANConfig, DiSANEncoder, NLIModel  # noqa: E402

KINDS = list(itertools.product(["multi_dim", "additive", "coda"], ["directional", "diag", "none"]))
V = 40


def encoder(**kw) -> DiSANEncoder:
    torch.manual_seed(0)
    cfg = DiSANConfig(vocab_size=V, embed_dim=8, d_h=6, **kw)
    return DiSANEncoder(cfg).double().eval()


@pytest.mark.parametrize("attention_kind", ["multi_dim", "additive", "coda"])
def test_directionality(attention_kind: str) -> None:
    enc = encoder(attention_kind=attention_kind)
    ids = torch.randint(2, V, (3, 7))
    mask = torch.ones_like(ids, dtype=torch.bool)
    k = 3
    changed = ids.clone()
    changed[:, k] = (ids[:, k] - 2 + 1) % (V - 2) + 2  # a different real token at position k
    _, a = enc(ids, mask, return_tokens=True)
    _, b = enc(changed, mask, return_tokens=True)
    assert torch.equal(a["u_fw"][:, :k], b["u_fw"][:, :k])          # forward: only earlier tokens
    assert torch.equal(a["u_bw"][:, k + 1:], b["u_bw"][:, k + 1:])  # backward: only later tokens
    # ... and the other side does see the change (so the test can fail).
    assert not torch.allclose(a["u_fw"][:, k + 1:], b["u_fw"][:, k + 1:])
    assert not torch.allclose(a["u_bw"][:, :k], b["u_bw"][:, :k])


@pytest.mark.parametrize(("attention_kind", "mask_kind"), KINDS)
def test_padding_does_not_change_the_sentence_vector(attention_kind: str, mask_kind: str) -> None:
    enc = encoder(attention_kind=attention_kind, mask_kind=mask_kind).float()
    ids = torch.randint(2, V, (4, 5))
    ids[1, 3:] = 0
    ids[2, 1:] = 0
    mask = ids != 0
    padded = torch.cat([ids, torch.zeros(4, 4, dtype=torch.long)], dim=1)
    with torch.no_grad():
        assert (enc(ids, mask) - enc(padded, padded != 0)).abs().max() < 1e-6


@pytest.mark.parametrize(("attention_kind", "mask_kind"), KINDS)
def test_no_nan_or_inf_for_short_and_padded_rows(attention_kind: str, mask_kind: str) -> None:
    torch.manual_seed(1)
    cfg = DiSANConfig(vocab_size=V, embed_dim=8, d_h=6, attention_kind=attention_kind, mask_kind=mask_kind,
                      task="sentiment", num_classes=3, head_dim=8)
    model = __import__("disan.model", fromlist=["build_model"]).build_model(cfg).train()
    for n, lengths in ((1, [1, 1]), (2, [1, 2]), (6, [1, 6, 1, 2])):
        ids = torch.randint(2, V, (len(lengths), n))
        for row, length in enumerate(lengths):
            ids[row, length:] = 0  # all padding but the first `length` tokens
        logits = model(ids, ids != 0)
        assert torch.isfinite(logits).all()
        model.zero_grad()
        logits.sum().backward()
        for name, p in model.named_parameters():
            assert p.grad is None or torch.isfinite(p.grad).all(), name


# ---- equations 14-20 and 12-13, written out with loops over positions --------------------------

def _dense(layer, x):
    return layer.act(layer.linear(x))


def loop_disa(block, x, mask, kind, direction):
    """u for one sentence x [n, d_e] following eqs. 14-20 (or CoDA / additive) position by position."""
    n = x.shape[0]
    h = [_dense(block.map, x[i]) for i in range(n)]                                    # eq. 14
    cfg = block.cfg
    out = []
    for i in range(n):
        allowed = [j for j in range(n) if mask[j] and (
            (j != i) if cfg.mask_kind == "diag" else (j < i if direction == "forward" else j > i))]
        s = torch.zeros_like(h[i])
        if allowed:
            pre = [block.w1(h[i]) + block.w2(h[j]) + block.b1 for j in allowed]
            if kind == "multi_dim":                                                   # eqs. 15-16
                logit = torch.stack([cfg.c * torch.tanh(p / cfg.c) for p in pre])     # [m, d]
                probs = torch.exp(logit) / torch.exp(logit).sum(0)                    # per feature
            elif kind == "additive":
                score = torch.stack([block.score(torch.tanh(p)).squeeze(-1) for p in pre])
                probs = (torch.exp(score) / torch.exp(score).sum())[:, None].expand(-1, h[i].shape[0])
            else:  # CoDA: tanh(E) * 2 sigmoid(N), N = -|W3 h_i - W4 h_j|
                dist = torch.stack([-(block.n1(h[i]) - block.n2(h[j])).abs() for j in allowed])
                if cfg.coda_gate == "scaled":
                    gate = 2 * torch.sigmoid(dist)
                else:  # centred over the valid positions
                    gate = torch.sigmoid(dist - dist.mean(0))
                probs = torch.tanh(torch.stack(pre)) * gate
            s = sum(probs[t] * h[j] for t, j in enumerate(allowed))
        f = torch.sigmoid(block.gate_s.linear(s) + block.gate_h.linear(h[i]))         # eq. 19
        out.append(f * h[i] + (1 - f) * s if mask[i] else torch.zeros_like(h[i]))     # eq. 20
    return torch.stack(out)


def loop_source2token(s2t, u, mask):
    """Eqs. 12-13 over the valid positions of u [n, D]."""
    valid = [i for i in range(u.shape[0]) if mask[i]]
    logits = torch.stack([s2t.map2.linear(F.elu(s2t.map1.linear(u[i]))) for i in valid])
    probs = torch.exp(logits) / torch.exp(logits).sum(0)
    return sum(probs[t] * u[i] for t, i in enumerate(valid))


@pytest.mark.parametrize(("kind", "mask_kind", "gate"), [
    ("multi_dim", "directional", "scaled"), ("multi_dim", "diag", "scaled"),
    ("additive", "directional", "scaled"), ("coda", "directional", "scaled"),
    ("coda", "directional", "centred")])
def test_equations_match_a_loop_implementation(kind: str, mask_kind: str, gate: str) -> None:
    enc = encoder(attention_kind=kind, mask_kind=mask_kind, coda_gate=gate)
    with torch.no_grad():
        enc.fw.b1.normal_()  # make the biases non-zero so they are checked too
        enc.bw.b1.normal_()
    ids = torch.randint(2, V, (2, 5))
    ids[1, 3:] = 0
    mask = ids != 0
    sent, tok = enc(ids, mask, return_tokens=True)
    bw_dir = "backward" if mask_kind == "directional" else "diag"
    for b in range(2):
        x = enc.embed(ids[b])
        u_fw = loop_disa(enc.fw, x, mask[b], kind, "forward")
        u_bw = loop_disa(enc.bw, x, mask[b], kind, bw_dir)
        torch.testing.assert_close(tok["u_fw"][b], u_fw, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(tok["u_bw"][b], u_bw, rtol=1e-9, atol=1e-10)
        ref = loop_source2token(enc.s2t, torch.cat([u_fw, u_bw], -1), mask[b])
        torch.testing.assert_close(sent[b], ref, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_packed_directions_match_the_per_block_path(dtype: torch.dtype) -> None:
    """The one-tensor path (both triangles packed) gives the per-block values: outputs,
    attention maps and gates, with padding, a 1-token row and an all-padding row."""
    enc = encoder().to(dtype)
    assert enc.packed
    with torch.no_grad():
        enc.fw.b1.normal_()
        enc.bw.b1.normal_()
    ids = torch.randint(2, V, (4, 9))
    ids[1, 5:] = 0
    ids[2, 1:] = 0
    ids[3, :] = 0
    mask = ids != 0
    packed_sent, packed = enc(ids, mask, return_tokens=True)
    enc.packed = False
    plain_sent, plain = enc(ids, mask, return_tokens=True)
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(packed_sent, plain_sent, **tol)
    for key in ("u_fw", "u_bw", "attn_fw", "attn_bw", "gate_fw", "gate_bw", "s2t"):
        torch.testing.assert_close(packed[key], plain[key], **tol, msg=key)
    assert torch.isfinite(packed_sent).all()


@pytest.mark.parametrize("chunk_cells", [1, 20, 10**6])
def test_query_chunked_attention_matches_the_packed_path(chunk_cells: int) -> None:
    """Query-row chunks (a scan: one row per step, uneven steps with a padded last chunk, one
    step) give exactly the unchunked packed values, with padding, a 1-token and an empty row."""
    enc = encoder().eval()
    ids = torch.randint(2, V, (4, 9))
    ids[1, 5:] = 0
    ids[2, 1:] = 0
    ids[3, :] = 0
    mask = ids != 0
    with torch.no_grad():
        plain = enc(ids, mask)
        enc.chunk_cells = chunk_cells
        chunked = enc(ids, mask)
        one = enc(ids[:1, :1], mask[:1, :1])  # n = 1
        enc.chunk_cells = 0
        torch.testing.assert_close(chunked, plain, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(one, enc(ids[:1, :1], mask[:1, :1]), rtol=1e-6, atol=1e-7)


def test_nli_model_has_the_papers_parameter_count() -> None:
    model = NLIModel(DiSANConfig(vocab_size=10, embed_dim=300, d_h=300))
    n = sum(p.numel() for name, p in model.named_parameters() if not name.startswith("encoder.embed."))
    assert math.isclose(n, 2.35e6, rel_tol=0.02), n


def test_pooled_without_each_masks_one_token_out_of_source2token() -> None:
    """Row i of pooled_without_each = source2token pooling with token i masked out (the token
    vectors u held fixed); a sentence's only token left out gives 0, like an empty sentence."""
    from disan.model import pooled_without_each

    enc = encoder()
    ids = torch.randint(2, V, (3, 6))
    mask = torch.arange(6)[None, :] < torch.tensor([6, 4, 1])[:, None]
    sent, ex = enc(ids * mask, mask, return_tokens=True)
    loo = pooled_without_each(ex["u"], ex["s2t_probs"], mask)
    assert loo.shape == (3, 6, enc.out_dim)
    torch.testing.assert_close((ex["s2t_probs"] * ex["u"]).sum(1), sent)
    for b in range(2):
        for i in range(int(mask[b].sum())):
            keep = mask[b: b + 1].clone()
            keep[0, i] = False
            want, _ = enc.s2t(ex["u"][b: b + 1], keep)
            torch.testing.assert_close(loo[b, i], want[0])
    assert torch.equal(loo[2, 0], torch.zeros(enc.out_dim, dtype=loo.dtype))


def test_nli_head_alone_matches_the_model() -> None:
    torch.manual_seed(0)
    model = NLIModel(DiSANConfig(vocab_size=V, embed_dim=8, d_h=6, head_dim=5)).eval()
    p, h = torch.randint(2, V, (2, 5)), torch.randint(2, V, (2, 3))
    pm, hm = torch.ones_like(p, dtype=torch.bool), torch.ones_like(h, dtype=torch.bool)
    u, v = model.encoder(p, pm), model.encoder(h, hm)
    torch.testing.assert_close(model.classify(u, v), model(p, pm, h, hm))


@pytest.mark.parametrize("mask_kind", ["none", "directional"])
def test_additive_source2token_weights_tokens_not_features(mask_kind: str) -> None:
    """s2t_kind="additive" (the word + additive attention ablation): one softmax weight per token,
    shared by all features, as a loop over positions computes it; padding changes nothing."""
    enc = encoder(mask_kind=mask_kind, s2t_kind="additive")
    assert enc.s2t.map2.linear.out_features == 1
    ids = torch.randint(2, V, (2, 6))
    ids[1, 4:] = 0
    mask = ids != 0
    sent, tok = enc(ids, mask, return_tokens=True)
    u = (enc.token_map(enc.embed(ids)) if mask_kind == "none"
         else torch.cat([tok["u_fw"], tok["u_bw"]], -1))
    for b in range(2):
        valid = [i for i in range(6) if mask[b, i]]
        scores = torch.stack([enc.s2t.map2.linear(F.elu(enc.s2t.map1.linear(u[b, i])))[0] for i in valid])
        probs = torch.softmax(scores, 0)
        torch.testing.assert_close(sent[b], sum(p * u[b, i] for p, i in zip(probs, valid, strict=True)),
                                   rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(tok["s2t"][b, valid], probs, rtol=1e-9, atol=1e-10)
    padded = torch.cat([ids, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    torch.testing.assert_close(enc(padded, padded != 0), sent, rtol=1e-9, atol=1e-10)
    multi = encoder(mask_kind=mask_kind)  # same seed, same weights but map2: a different model
    assert not torch.allclose(multi(ids, mask), sent)


@pytest.mark.parametrize("encoder_kind", ["multi_head", "bilstm"])
def test_baseline_encoders_ignore_padding_see_order_and_stay_finite(encoder_kind: str) -> None:
    """The paper's multi-head and Bi-LSTM (+ source2token) baselines: padding changes nothing,
    word order matters (positions / recurrence), short and empty rows stay finite with gradients."""
    enc = encoder(encoder_kind=encoder_kind)
    assert not hasattr(enc, "fw") and not enc.packed
    ids = torch.randint(2, V, (3, 6))
    ids[1, 4:] = 0
    ids[2, 1:] = 0
    mask = ids != 0
    sent = enc(ids, mask)
    padded = torch.cat([ids, torch.zeros(3, 3, dtype=torch.long)], dim=1)
    torch.testing.assert_close(enc(padded, padded != 0), sent, rtol=1e-9, atol=1e-10)
    for b, length in ((0, 6), (1, 4), (2, 1)):  # each sentence alone, unpadded: the same vector
        torch.testing.assert_close(enc(ids[b:b + 1, :length], mask[b:b + 1, :length])[0], sent[b],
                                   rtol=1e-9, atol=1e-10)
    flipped = ids[:1].flip(1)
    assert not torch.allclose(enc(flipped, flipped != 0), sent[:1])
    enc.train()
    ids[2, :] = 0  # an all-padding row
    out = enc(ids, ids != 0)
    out.sum().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in enc.parameters() if p.grad is not None)


def test_ids_past_the_table_read_as_unk(tmp_path) -> None:
    """A bundle vocabulary may append another model's words: their ids (>= vocab_size) are
    unknown words to this model, in eager PyTorch and in its ONNX graph alike."""
    pytest.importorskip("onnxruntime")
    from model_export.graphs.wrappers import EncoderGraph, export_graph
    from model_export.sessions import session

    enc = encoder().float()
    mask = torch.ones(2, 4, dtype=torch.bool)
    known = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    past = known.clone()
    past[0, 1], past[1, 3] = V, V + 1000  # words appended after this model's own
    as_unk = known.clone()
    as_unk[0, 1], as_unk[1, 3] = 1, 1
    with torch.no_grad():
        want = enc(as_unk, mask)
        torch.testing.assert_close(enc(past, mask), want, rtol=0, atol=0)
        assert not torch.allclose(enc(known, mask), want)  # the swapped words do change the vector
    path = export_graph(EncoderGraph(enc), tmp_path / "encoder.onnx", V)
    got = session(path).run(None, {"ids": past.numpy(), "mask": mask.numpy()})[0]
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=0, atol=1e-5)


def test_ids_past_the_offset_read_borrowed_rows_through_the_map(tmp_path) -> None:
    """A piece encoder that reads whole words (`disan distill whole-words`): id borrowed_offset + r
    reads borrowed row r through borrow_map, ids below read its own table, ids past the borrowed
    rows read as UNK; the ONNX graph reads them alike."""
    pytest.importorskip("onnxruntime")
    from model_export.graphs.wrappers import EncoderGraph, export_graph
    from model_export.sessions import session

    rows = 7
    enc = encoder(borrowed_rows=rows, borrowed_dim=5, borrowed_offset=V).float()
    with torch.no_grad():
        enc.borrowed.copy_(torch.randn(rows, 5))
        ids = torch.tensor([[5, V + 3, V, 9], [V + rows - 1, 6, V + rows, 2]])
        got = enc.word_vectors(ids)
        torch.testing.assert_close(got[0, 1], enc.borrow_map(enc.borrowed[3]), rtol=0, atol=1e-6)
        torch.testing.assert_close(got[0, 2], enc.borrow_map(enc.borrowed[0]), rtol=0, atol=1e-6)
        torch.testing.assert_close(got[1, 0], enc.borrow_map(enc.borrowed[rows - 1]), rtol=0, atol=1e-6)
        torch.testing.assert_close(got[1, 2], enc.embed.weight[1], rtol=0, atol=0)  # past them: UNK
        torch.testing.assert_close(got[0, 0], enc.embed.weight[5], rtol=0, atol=0)
        mask = torch.ones(2, 4, dtype=torch.bool)
        want = enc(ids, mask)
    path = export_graph(EncoderGraph(enc), tmp_path / "encoder.onnx", V + rows)
    out = session(path).run(None, {"ids": ids.numpy(), "mask": mask.numpy()})[0]
    torch.testing.assert_close(torch.from_numpy(out), want, rtol=0, atol=1e-5)


def test_a_unit_length_encoder_serves_its_heads_directions_at_length_one(tmp_path) -> None:
    """unit_length ends the encoder in an L2 normalisation: the same direction as the head alone,
    length 1, in PyTorch and in the exported graph alike."""
    pytest.importorskip("onnxruntime")
    from model_export.graphs.wrappers import EncoderGraph, export_graph
    from model_export.sessions import session

    plain, unit = encoder(proj_dim=10).float(), encoder(proj_dim=10, unit_length=True).float()
    unit.load_state_dict(plain.state_dict())
    ids = torch.tensor([[5, 7, 9, 3], [4, 6, 0, 0]])
    mask = ids > 0
    with torch.no_grad():
        raw, got = plain(ids, mask), unit(ids, mask)
    assert not torch.allclose(raw.norm(dim=-1), torch.ones(2), atol=1e-3)  # the head alone is not unit
    torch.testing.assert_close(got, raw / raw.norm(dim=-1, keepdim=True), rtol=0, atol=1e-6)
    out = session(export_graph(EncoderGraph(unit), tmp_path / "encoder.onnx", V)).run(
        None, {"ids": ids.numpy(), "mask": mask.numpy()})[0]
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    torch.testing.assert_close(torch.from_numpy(out), got, rtol=0, atol=1e-5)
    # the normalisation belongs to the head: without it (as fitting the head reads the encoder), the
    # source2token vector as it is
    plain.proj = unit.proj = None
    with torch.no_grad():
        torch.testing.assert_close(unit(ids, mask), plain(ids, mask), rtol=0, atol=0)
    with pytest.raises(ValueError, match="unit_length"):
        encoder(unit_length=True)  # no head to end


def test_a_further_layer_starts_as_a_pass_through_and_then_reads_context() -> None:
    """layers=2: with the first layer's weights and the new gain at 0 the vectors are the one-layer
    model's; with a gain the further layer changes them, the packed and per-block paths agree, and
    padding still does not matter."""
    one = encoder()
    torch.manual_seed(0)
    two = DiSANEncoder(DiSANConfig(vocab_size=V, embed_dim=8, d_h=6, layers=2)).double().eval()
    missing, unexpected = two.load_state_dict(one.state_dict(), strict=False)
    assert not unexpected and missing and all(k.startswith("upper.0.") for k in missing)
    ids = torch.randint(2, V, (3, 7))
    ids[1, 4:] = 0
    mask = ids != 0
    with torch.no_grad():
        torch.testing.assert_close(two(ids, mask), one(ids, mask), rtol=0, atol=0)
        two.upper[0].gain.fill_(0.5)
        grown = two(ids, mask)
        assert (grown - one(ids, mask)).abs().max() > 1e-3
        two.packed = False
        torch.testing.assert_close(two(ids, mask), grown, rtol=1e-12, atol=1e-12)
        two.packed = True
        padded = two(torch.cat([ids, torch.zeros(3, 3, dtype=ids.dtype)], 1),
                     torch.cat([mask, torch.zeros(3, 3, dtype=torch.bool)], 1))
        torch.testing.assert_close(padded, grown, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="layers=2"):
        DiSANEncoder(DiSANConfig(vocab_size=V, embed_dim=8, d_h=6, layers=2, encoder_kind="bilstm"))
