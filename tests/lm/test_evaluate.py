"""Scoring a causal byte-level LM (topo_attn.lm.evaluate): per-position losses against transformers' own loss
and a hand-written cross-entropy on a tiny random Llama, bits per byte by position bucket on hand-made losses,
and the passkey scores against a manual check, with stand-in models whose predictions are known."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from topo_attn.lm import evaluate, probe
from topo_attn.lm.train import probe_set

transformers = pytest.importorskip("transformers", minversion="5")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

VOCAB = 256


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    """2 layers, hidden 64, 4 query / 2 key-value heads of dim 16, vocabulary 256, random weights (initializer
    range 0.1: logits far from uniform), float32, SDPA, eval mode."""
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         initializer_range=0.1, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(torch.float32).eval()


def byte_ids(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def documents(count: int, length: int, seed: int = 0) -> np.ndarray:
    """Random printable bytes without quotes or newlines (as in test_probe.py)."""
    rng = np.random.default_rng(seed)
    return rng.integers(ord("("), ord("~"), (count, length)).astype(np.uint8)


def manual_losses(model, ids: torch.Tensor) -> torch.Tensor:
    """``-log p(byte t + 1 | bytes 0..t)`` per document and position, written out by hand."""
    with torch.no_grad():
        logits = model(ids).logits.double()
    log_p = torch.log_softmax(logits[:, :-1], dim=-1)
    return -log_p.gather(-1, ids[:, 1:, None]).squeeze(-1)


# ------------------------------------------------------------------------------------------- token_losses
def test_token_losses_equal_the_manual_and_transformers_loss(model):
    ids = byte_ids(2, 48)
    losses = evaluate.token_losses(model, ids, batch=2)
    assert losses.shape == (2, 47) and losses.dtype == torch.float32 and losses.device.type == "cpu"
    torch.testing.assert_close(losses.double(), manual_losses(model, ids), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        shifted_mean = model(ids, labels=ids).loss  # transformers shifts the labels itself
    assert float(losses.mean()) == pytest.approx(float(shifted_mean), rel=1e-5)
    # the comparison is tight enough to see a loss of the wrong position (byte t + 1 scored by logits t + 1)
    with torch.no_grad():
        log_p = torch.log_softmax(model(ids).logits.double()[:, 1:], dim=-1)
    unshifted = -log_p.gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert (losses.double() - unshifted).abs().max() > 0.1


def test_token_losses_do_not_depend_on_the_batch_or_the_id_dtype(model):
    ids = byte_ids(3, 40, seed=2)
    one = evaluate.token_losses(model, ids, batch=1)
    torch.testing.assert_close(evaluate.token_losses(model, ids, batch=2), one, rtol=1e-5, atol=1e-5)  # 2 + 1
    torch.testing.assert_close(evaluate.token_losses(model, ids, batch=3), one, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(evaluate.token_losses(model, ids.to(torch.uint8), batch=2), one, rtol=1e-5,
                               atol=1e-5)
    # each document's losses are its own
    torch.testing.assert_close(evaluate.token_losses(model, ids[1:2]), one[1:2], rtol=1e-5, atol=1e-5)
    assert (one[0] - one[1]).abs().max() > 0.1


@pytest.mark.parametrize("ids, match", [
    (torch.arange(10), "must be \\[N, L\\]"),
    (torch.zeros(2, 1, dtype=torch.long), "L >= 2"),
    (torch.zeros(2, 3, 4, dtype=torch.long), "must be \\[N, L\\]"),
    (torch.tensor([[1, 2, 256]]), "0..255"),
    (torch.tensor([[1, -1, 3]]), "0..255"),
])
def test_token_losses_errors(model, ids, match):
    with pytest.raises(ValueError, match=match):
        evaluate.token_losses(model, ids)


# ------------------------------------------------------------------------------------------- bits per byte
def test_bucket_names():
    assert [evaluate.bucket_name(*b) for b in evaluate.BUCKETS] == ["0-1k", "1k-4k", "4k-8k", "8k+"]
    assert evaluate.bucket_name(0, 10) == "0-10"
    assert evaluate.bucket_name(1536, 2048) == "1536-2k"
    assert evaluate.bucket_name(100, None) == "100+"


def test_bits_per_byte_by_bucket_of_the_predicted_position():
    gen = torch.Generator().manual_seed(3)
    # 5000 predicted bytes (positions 1..5000), each bucket's losses on another level, so that a position
    # counted in the wrong bucket moves the bucket's mean
    losses = torch.rand(3, 5000, generator=gen, dtype=torch.float64)
    losses[:, 1023:4095] += 2.0
    losses[:, 4095:] += 5.0
    bits = evaluate.bits_per_byte(losses)
    ln2 = math.log(2)
    assert set(bits) == {"all", "0-1k", "1k-4k", "4k-8k"}  # no predicted position lies in 8k+
    assert bits["all"] == pytest.approx(float(losses.mean()) / ln2, rel=1e-12)
    # index t is the loss of position t + 1: positions 1..1023 are indices 0..1022, and so on
    assert bits["0-1k"] == pytest.approx(float(losses[:, :1023].mean()) / ln2, rel=1e-12)
    assert bits["1k-4k"] == pytest.approx(float(losses[:, 1023:4095].mean()) / ln2, rel=1e-12)
    assert bits["4k-8k"] == pytest.approx(float(losses[:, 4095:].mean()) / ln2, rel=1e-12)
    # the same for float32 losses, as token_losses returns them
    bits32 = evaluate.bits_per_byte(losses.float())
    assert set(bits32) == set(bits) and all(bits32[k] == pytest.approx(bits[k], rel=1e-5) for k in bits)


def test_document_bits_per_byte_is_each_documents_mean_and_averages_to_the_whole():
    gen = torch.Generator().manual_seed(4)
    losses = torch.rand(5, 300, generator=gen) * torch.arange(1, 6).unsqueeze(1)  # documents on other levels
    per_document = evaluate.document_bits_per_byte(losses)
    assert len(per_document) == 5 and all(isinstance(v, float) for v in per_document)
    for row, value in zip(losses, per_document):
        assert value == pytest.approx(float(row.double().mean()) / math.log(2), rel=1e-12)
    assert sum(per_document) / 5 == pytest.approx(evaluate.bits_per_byte(losses)["all"], rel=1e-6)


def test_bits_per_byte_with_own_buckets():
    losses = torch.arange(1.0, 10.0, dtype=torch.float64)[None].repeat(2, 1)  # index t: loss t + 1 = position
    ln2 = math.log(2)
    bits = evaluate.bits_per_byte(losses, buckets=((0, 1), (0, 4), (4, None), (20, 30)))
    # (0, 1) holds only position 0, which is never predicted; (20, 30) lies past the end
    assert set(bits) == {"all", "0-4", "4+"}
    assert bits["0-4"] == pytest.approx(2.0 / ln2)  # positions 1, 2, 3
    assert bits["4+"] == pytest.approx(6.5 / ln2)  # positions 4..9
    assert bits["all"] == pytest.approx(5.0 / ln2)
    assert evaluate.bits_per_byte(losses, buckets=()) == {"all": pytest.approx(5.0 / ln2)}


# ------------------------------------------------------------------------------------------- passkey scores
@pytest.fixture(scope="module")
def probes() -> list[probe.Passkey]:
    """Two probes at distance 64 and two at 128, on different random documents of 256 bytes."""
    found = probe_set(documents(3, 256), [64, 128], 2, seed=0)
    assert [p.distance for p in found] == [64, 64, 128, 128]
    return found


def manual_passkey(model, key: probe.Passkey) -> tuple[float, bool, list[bool]]:
    ids = torch.from_numpy(key.ids.astype(np.int64))[None]
    with torch.no_grad():
        logits = model(ids).logits[0].double()
    targets = torch.from_numpy(key.targets)
    log_p = torch.log_softmax(logits, dim=-1)
    true = ids[0, targets]
    loss = float(-log_p[targets - 1, true].mean())
    right = [int(logits[t - 1].argmax()) == int(ids[0, t]) for t in key.targets]
    return loss, all(right), right


def test_passkey_scores_equal_a_manual_cross_entropy(model, probes):
    """Loss, exact match, and the right answer bytes split into a passkey's one lookup (its value's first byte)
    and its copies, each against a manual computation."""
    rows = evaluate.passkey_scores(model, probes)
    assert len(rows) == len(probes) and [r["distance"] for r in rows] == [p.distance for p in probes]
    for row, key in zip(rows, probes):
        loss, exact, right = manual_passkey(model, key)
        assert set(row) == {"distance", "loss", "exact", "lookups", "lookups_right", "copies", "copies_right"}
        assert isinstance(row["exact"], bool)
        assert row["loss"] == pytest.approx(loss, rel=1e-5) and row["exact"] == exact
        assert list(key.lookups) == [0] and (row["lookups"], row["copies"]) == (1, len(right) - 1)
        assert (row["lookups_right"], row["copies_right"]) == (int(right[0]), sum(right[1:]))
    assert len({round(r["loss"], 4) for r in rows}) == len(rows)  # every probe scored on its own bytes


def test_passkey_scores_in_batches_equal_one_at_a_time(model, probes):
    one = evaluate.passkey_scores(model, probes, batch=1)
    for batch in (2, 4):
        rows = evaluate.passkey_scores(model, probes, batch=batch)
        assert [r["distance"] for r in rows] == [r["distance"] for r in one]
        assert [r["exact"] for r in rows] == [r["exact"] for r in one]
        assert [r["loss"] for r in rows] == pytest.approx([r["loss"] for r in one], rel=1e-5)


def test_passkey_scores_reject_unequal_lengths_in_one_batch(model):
    short = probe.passkey_document(documents(1, 200, seed=1)[0], 64, np.random.default_rng(1))
    long = probe.passkey_document(documents(1, 256, seed=2)[0], 64, np.random.default_rng(2))
    with pytest.raises(ValueError, match="equal lengths"):
        evaluate.passkey_scores(model, [short, long], batch=2)
    assert len(evaluate.passkey_scores(model, [short, long], batch=1)) == 2


class Copier(torch.nn.Module):
    """A stand-in causal LM that predicts, at position ``t``, the byte ``distance`` positions before the next
    one (``ids[t + 1 - distance]``, a byte already seen): logit ``margin`` on it, 0 on the other bytes. On a
    passkey probe at that distance it reproduces the repeated value exactly."""

    def __init__(self, distance: int, margin: float = 10.0):
        super().__init__()
        self.config = SimpleNamespace(vocab_size=VOCAB)
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # where the scorer looks up the device
        self.distance, self.margin = distance, margin

    def forward(self, ids: torch.Tensor):
        source = (torch.arange(ids.shape[1]) + 1 - self.distance).clamp(min=0)
        logits = self.margin * torch.nn.functional.one_hot(ids[:, source], VOCAB).float()
        return SimpleNamespace(logits=logits + 0 * self.anchor)


def test_passkey_exact_when_the_model_copies_from_the_probe_distance(probes):
    # with logit 10 on the right byte and 0 on 255 others, each byte's loss is log(1 + 255 e^-10)
    right = math.log1p(255 * math.exp(-10.0))
    rows = evaluate.passkey_scores(Copier(64), probes, batch=2)
    assert [r["exact"] for r in rows] == [True, True, False, False]  # exact at distance 64 only
    for row, key in zip(rows, probes):
        # float32 logits: the small losses are right to ~1e-6 absolute
        assert row["loss"] == pytest.approx(manual_passkey(Copier(64), key)[0], rel=1e-5, abs=1e-5)
    assert all(r["loss"] == pytest.approx(right, abs=1e-5) for r in rows[:2])
    assert all(r["loss"] > 1.0 for r in rows[2:])
    assert all(r["exact"] and r["loss"] == pytest.approx(right, abs=1e-5)
               for r in evaluate.passkey_scores(Copier(128), probes[2:]))


def test_passkey_not_exact_when_the_model_copies_from_one_byte_off(probes):
    # off by one in either direction: the first value byte is predicted from a quote or from the line's head
    for distance in (63, 65):
        rows = evaluate.passkey_scores(Copier(distance), probes[:2])
        assert not any(r["exact"] for r in rows) and all(r["loss"] > 1.0 for r in rows)
        for row, key in zip(rows, probes[:2]):
            loss, exact, _ = manual_passkey(Copier(distance), key)
            assert row["loss"] == pytest.approx(loss, rel=1e-5) and row["exact"] == exact


def test_passkey_not_exact_when_one_value_byte_is_wrong(probes):
    key = probes[0]

    class AllButLast(Copier):
        """Right on every value byte but the last."""

        def forward(self, ids):
            out = super().forward(ids)
            out.logits[:, int(key.targets[-1]) - 1] = torch.flip(out.logits[:, int(key.targets[-1]) - 1], [-1])
            return out

    (row,) = evaluate.passkey_scores(AllButLast(64), [key])
    assert row["exact"] is False
    # 15 bytes right, the last one wrong (its true byte now has logit 0 and another byte 10)
    right = math.log1p(255 * math.exp(-10.0))
    assert row["loss"] == pytest.approx((15 * right + (10.0 + right)) / 16, rel=1e-4)
