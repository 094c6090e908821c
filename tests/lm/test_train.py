"""Training the byte-level model (topo_attn.lm.train): a tiny CPU run on a synthetic corpus of Python-like
files (its checkpoint, log, manifest and evaluation set), and the small functions it is built from."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import re

import numpy as np
import pytest
import torch
from helpers import write_corpus

from topo_attn.lm import corpus, train
from topo_attn.lm.evaluate import bits_per_byte, token_losses
from topo_attn.lm.probe import passkey_document
from topo_attn.lm.train import ModelShape, TrainSettings

transformers = pytest.importorskip("transformers", minversion="5")
from transformers import LlamaForCausalLM  # noqa: E402

LINE = re.compile(rb'\n([a-z]{3,8}_[a-z]{3,8}) = "([0-9a-zA-Z]+)"\n')
SHAPE = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128)
# context 256 rather than 128: probe_distances(128) is [0], which fits no probe, so the final passkey score
# would be empty
SETTINGS = TrainSettings(context=256, batch=2, steps=3, warmup=1, eval_every=2, eval_documents=2, log_every=1,
                         seed=0)


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus") / "lib"
    write_corpus(root, 300)
    roots = [("stdlib", root)]
    _, validation = corpus.split_sources(corpus.find_sources(roots))
    # enough held-out bytes for the evaluation documents (a precondition of the run, not a result)
    assert sum(f.size for f in validation) >= SETTINGS.eval_documents * SETTINGS.context
    return roots


@pytest.fixture(scope="module")
def trained(tmp_path_factory, roots):
    out = tmp_path_factory.mktemp("run") / "model"
    summary = train.train(out, SETTINGS, SHAPE, device="cpu", roots=roots, progress=False)
    return out, summary


def read_log(out) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------- the run
def test_run_writes_its_files(trained, roots):
    out, _ = trained
    for name in ("config.json", "model.safetensors", "train_log.jsonl", "corpus_manifest.json.gz", "eval_set.npz"):
        assert (out / name).is_file(), name
    # the evaluation set: the first held-out documents of the context length, from the validation files
    train_files, validation = corpus.split_sources(corpus.find_sources(roots))
    docs = np.load(out / "eval_set.npz")["documents"]
    assert docs.dtype == np.uint8 and docs.shape == (SETTINGS.eval_documents, SETTINGS.context)
    assert np.array_equal(docs, corpus.documents(corpus.pack(validation), SETTINGS.context, SETTINGS.eval_documents))
    # the manifest: every file once, on its side
    with gzip.open(out / "corpus_manifest.json.gz", "rt") as f:
        manifest = json.load(f)
    assert manifest["train_files"] == len(train_files) and manifest["validation_files"] == len(validation)
    assert len(manifest["files"]) == 300
    assert {f["name"] for f in manifest["files"] if f["side"] == "validation"} == {f.name for f in validation}


def test_run_log_and_summary(trained):
    out, summary = trained
    log = read_log(out)
    assert log[0]["event"] == "corpus" and log[0]["eval_documents"] == SETTINGS.eval_documents
    assert log[0]["settings"]["context"] == SETTINGS.context and log[0]["shape"]["hidden"] == SHAPE.hidden
    steps = [r for r in log if r["event"] == "step"]
    assert [r["step"] for r in steps] == [0, 1, 2]  # log_every=1
    assert steps[-1]["bits_per_byte"] < steps[0]["bits_per_byte"]  # it learns
    for r in steps:
        assert math.isfinite(r["bits_per_byte"]) and 0 < r["bits_per_byte"] < 12  # ~8 bits at random init
        assert r["lr"] == pytest.approx(train.learning_rate(r["step"], SETTINGS))
    validations = [r for r in log if r["event"] == "validation"]
    assert [r["step"] for r in validations] == [2, 3]  # eval_every=2, then the final one after 3 steps
    assert all(set(r["bits_per_byte"]) == {"all", "0-1k"} for r in validations)
    assert log[-1]["event"] == "final" and log[-1] == json.loads(json.dumps(summary))
    assert summary["steps"] == 3 and summary["bytes"] == 3 * SETTINGS.batch * SETTINGS.context
    assert summary["bits_per_byte"] == validations[-1]["bits_per_byte"]
    (distance,) = train.probe_distances(SETTINGS.context)
    assert summary["passkey"][str(distance)]["probes"] == 8
    assert math.isfinite(summary["passkey"][str(distance)]["loss"])


def test_checkpoint_loads_and_scores_the_evaluation_set(trained):
    out, summary = trained
    model = LlamaForCausalLM.from_pretrained(out).eval()
    config = model.config
    assert (config.vocab_size, config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
            config.num_key_value_heads, config.head_dim) == (256, 2, 64, 4, 2, 16)
    assert config.max_position_embeddings == SETTINGS.context
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # saved in bfloat16
    model = model.float()
    docs = torch.from_numpy(np.load(out / "eval_set.npz")["documents"].astype(np.int64))
    with torch.no_grad():
        logits = model(docs).logits
    assert logits.shape == (*docs.shape, 256) and bool(torch.isfinite(logits).all())
    # the final validation was computed with the float32 weights; the saved ones are rounded to bfloat16
    final = bits_per_byte(token_losses(model, docs))["all"]
    assert final == pytest.approx(summary["bits_per_byte"]["all"], abs=0.02)
    # the same model before training (the run seeds torch, then builds it) did worse
    torch.manual_seed(SETTINGS.seed)
    untrained = LlamaForCausalLM(train.lm_config(SHAPE, SETTINGS.context)).eval()
    assert bits_per_byte(token_losses(untrained, docs))["all"] > final + 0.1


def test_run_is_seeded(trained, roots, tmp_path):
    out, summary = trained
    again = train.train(tmp_path / "again", SETTINGS, SHAPE, device="cpu", roots=roots, progress=False)
    assert [r["bits_per_byte"] for r in read_log(tmp_path / "again") if r["event"] == "step"] == \
        [r["bits_per_byte"] for r in read_log(out) if r["event"] == "step"]
    assert again["bits_per_byte"] == summary["bits_per_byte"]
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


def test_train_rejects_bad_settings(tmp_path, roots):
    for bad in (dict(steps=0), dict(context=0), dict(eval_every=0)):
        with pytest.raises(ValueError, match=f"{next(iter(bad))} must be >= 1"):
            train.train(tmp_path, dataclasses.replace(SETTINGS, **bad), SHAPE, device="cpu", roots=roots,
                        progress=False)
    for bad in (dict(context=128), dict(stop_after=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            train.train(tmp_path, dataclasses.replace(SETTINGS, **bad), SHAPE, device="cpu", roots=roots,
                        progress=False)
    # held-out files too short for one evaluation document
    with pytest.raises(ValueError, match="fewer than one evaluation document"):
        train.train(tmp_path, dataclasses.replace(SETTINGS, context=1 << 20), SHAPE, device="cpu",
                    roots=roots, progress=False)


def test_stop_after_ends_the_run_early_on_the_full_schedule(roots, tmp_path):
    settings = dataclasses.replace(SETTINGS, steps=6, stop_after=3, eval_every=100)
    summary = train.train(tmp_path / "short", settings, SHAPE, device="cpu", roots=roots, progress=False)
    log = read_log(tmp_path / "short")
    steps = [r for r in log if r["event"] == "step"]
    assert [r["step"] for r in steps] == [0, 1, 2] and summary["steps"] == 3
    assert [r for r in log if r["event"] == "stopped"][0]["reason"] == "stop_after=3 reached"
    # the learning rate followed the 6-step schedule, not a 3-step one
    assert steps[2]["lr"] == pytest.approx(train.learning_rate(2, settings))
    assert steps[2]["lr"] != pytest.approx(train.learning_rate(2, dataclasses.replace(settings, steps=3)))


# --------------------------------------------------------------------------------------- small functions
def test_learning_rate_warmup_then_cosine_to_ten_percent():
    settings = TrainSettings(lr=2e-3, warmup=10, steps=110)
    lr = [train.learning_rate(s, settings) for s in range(130)]
    assert lr[:10] == pytest.approx([2e-3 * (s + 1) / 10 for s in range(10)])  # linear up to the peak
    assert lr[10] == pytest.approx(2e-3)  # the peak: where the decay starts
    assert lr[60] == pytest.approx(2e-3 * 0.55)  # half way: the middle of 1.0 and 0.1
    assert lr[110] == pytest.approx(2e-4) and lr[129] == pytest.approx(2e-4)  # 10%, and kept there
    assert all(a >= b for a, b in zip(lr[10:], lr[11:])) and lr[11] < lr[10]
    for s in (20, 75):
        progress = (s - 10) / 100
        assert lr[s] == pytest.approx(2e-3 * (0.1 + 0.45 * (1 + math.cos(math.pi * progress))))


def test_training_batch_windows_of_the_stream():
    rng = np.random.default_rng(0)
    stream = rng.integers(ord("("), ord("~"), 5000).astype(np.uint8)  # no quotes or newlines
    plain = TrainSettings(context=64, batch=5, copy_fraction=0.0)
    batch = train.training_batch(stream, plain, np.random.default_rng(1))
    assert batch.shape == (5, 65) and batch.dtype == torch.int64
    text = stream.tobytes()
    for row in batch.numpy().astype(np.uint8):  # each row a window of the stream
        assert row.tobytes() in text and not LINE.search(row.tobytes())
    again = train.training_batch(stream, plain, np.random.default_rng(1))
    assert torch.equal(batch, again)
    assert not torch.equal(batch, train.training_batch(stream, plain, np.random.default_rng(2)))
    # with copy_fraction 1, every row holds key lines (insert_copies may push a second copy past the end)
    copies = TrainSettings(context=512, batch=4, copy_fraction=1.0, max_pairs=2)
    batch = train.training_batch(stream, copies, np.random.default_rng(3))
    assert batch.shape == (4, 513) and int(batch.min()) >= 0 and int(batch.max()) < 256
    for row in batch.numpy().astype(np.uint8):
        assert LINE.search(row.tobytes()) and row.tobytes() not in text


def test_probe_distances_fit_a_document_of_the_context():
    assert train.probe_distances(4096) == [1024, 2048, 3968]
    assert train.probe_distances(1024) == [896]
    assert train.probe_distances(256) == [128]
    with pytest.raises(ValueError, match="context"):
        train.probe_distances(128)
    rng = np.random.default_rng(0)
    for context in (256, 1024, 4096, 8192):
        distances = train.probe_distances(context)
        assert distances == sorted(distances) and distances[-1] == context - 128
        doc = rng.integers(ord("("), ord("~"), context).astype(np.uint8)
        for distance in distances:  # every distance fits, whatever the key line's length
            for seed in range(5):
                assert passkey_document(doc, distance, np.random.default_rng(seed)).distance == distance


def test_lm_config():
    config = train.lm_config(SHAPE, 512)
    assert (config.vocab_size, config.hidden_size, config.intermediate_size, config.num_hidden_layers,
            config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (256, 64, 128, 2, 4, 2, 16)
    assert config.max_position_embeddings == 512 and config.tie_word_embeddings is False
    assert config.bos_token_id is None and config.eos_token_id is None and config.pad_token_id is None
    assert config.rope_parameters["rope_theta"] == SHAPE.rope_theta and config.attention_dropout == 0.0
