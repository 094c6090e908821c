"""Training the byte-level model (topo_attn.lm.train): a tiny CPU run on a synthetic corpus of Python-like
files (its checkpoint, log, manifest and per-file evaluation set), and the small functions it is built from
(the copy content of its batches: tests/lm/test_training_copies.py)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math

import numpy as np
import pytest
import torch
from helpers import write_corpus, write_train_corpus

from topo_attn.lm import corpus, train
from topo_attn.lm.evaluate import bits_per_byte, token_losses
from topo_attn.lm.probe import passkey_document
from topo_attn.lm.train import ModelShape, TrainSettings

transformers = pytest.importorskip("transformers", minversion="5")
from transformers import LlamaForCausalLM  # noqa: E402

SHAPE = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128)
# context 256 rather than 128: probe_distances(128) is [0], which fits no probe, so the final passkey score
# would be empty
SETTINGS = TrainSettings(context=256, batch=2, steps=3, warmup=1, eval_every=2, eval_documents=2, log_every=1,
                         seed=0)


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    return write_train_corpus(tmp_path_factory.mktemp("corpus"))


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
    train_files, validation = corpus.split_sources(corpus.find_sources(roots))
    # the manifest: every file once, on its side
    with gzip.open(out / "corpus_manifest.json.gz", "rt") as f:
        manifest = json.load(f)
    assert manifest["train_files"] == len(train_files) and manifest["validation_files"] == len(validation)
    assert len(manifest["files"]) == 700
    assert {f["name"] for f in manifest["files"] if f["side"] == "validation"} == {f.name for f in validation}


def test_run_writes_the_per_file_evaluation_set_with_its_file_list(trained, roots):
    out, _ = trained
    expected = corpus.build_eval_set(corpus.find_sources(roots), SETTINGS.context, SETTINGS.eval_documents,
                                     train.eval_packages(SETTINGS.eval_documents), SETTINGS.seed)
    with np.load(out / "eval_set.npz") as data:
        docs, names, offsets, hashes = data["documents"], list(data["names"]), data["offsets"], list(data["sha256"])
    assert docs.dtype == np.uint8 and docs.shape == (SETTINGS.eval_documents, SETTINGS.context)
    assert np.array_equal(docs, expected.documents) and names == [f.name for f in expected.files]
    # one window per file, of a standard-library file and a package's, each the file's bytes at its offset
    assert len(set(names)) == len(names) and {corpus.package_of(n) for n in names} == {"stdlib", "site0"}
    files = {f.name: f for f in corpus.find_sources(roots)}
    for doc, name, offset, sha in zip(docs, names, offsets.tolist(), hashes):
        assert files[name].sha256 == sha and name in {f.name for f in expected.split.validation}
        assert doc.tobytes() == files[name].path.read_bytes()[offset:offset + SETTINGS.context]
    # not the consecutive windows of the packed validation files that train() wrote before
    _, validation = corpus.split_sources(corpus.find_sources(roots))
    assert not np.array_equal(docs, corpus.documents(corpus.pack(validation), SETTINGS.context,
                                                     SETTINGS.eval_documents))
    record = json.loads((out / "eval_set.json").read_text())
    assert [f["name"] for f in record["files"]] == names and record["documents"] == SETTINGS.eval_documents
    logged = read_log(out)[0]["eval_set"]
    assert logged["documents"] == 2 and logged["packages"] == 1 and logged["stdlib_files"] == 1


def test_a_corpus_without_the_evaluation_set_fails_before_anything_is_written(tmp_path):
    write_corpus(tmp_path / "lib", 300)  # standard library only: no package for the set
    with pytest.raises(ValueError, match=r"eval_documents=2 documents of context=256 bytes: the evaluation set "
                                         r"needs files of at least 1 packages and the standard library"):
        train.train(tmp_path / "never", SETTINGS, SHAPE, device="cpu", roots=[("stdlib", tmp_path / "lib")],
                    progress=False)
    assert not (tmp_path / "never").exists()


def test_eval_packages():
    assert train.eval_packages(128) == corpus.MIN_PACKAGES == 20 and train.eval_packages(21) == 20
    assert train.eval_packages(20) == 19 and train.eval_packages(2) == 1 and train.eval_packages(1) == 0
    assert TrainSettings().eval_documents == corpus.EVAL_FILES
    with pytest.raises(ValueError, match="eval_documents must be >= 1"):
        train.eval_packages(0)


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
        # the copy content's lookup bytes since the last log: their count, and their loss where there are some
        assert r["lookup_bytes"] >= 0 and (r["lookup_bits"] is None) == (r["lookup_bytes"] == 0)
        assert r["lookup_bits"] is None or 0 < r["lookup_bits"] < 20
    assert sum(r["lookup_bytes"] for r in steps) > 0
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
    with pytest.raises(ValueError, match="eval_documents=2 documents of context=1048576 bytes: the evaluation set "
                                         "needs 2 validation files of >= 1048576 bytes"):
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


def test_a_stop_by_the_clock_says_the_schedule_was_not_finished(roots, tmp_path, capsys):
    """--max-minutes stops the run but keeps the --steps schedule: the stop is logged with the learning rate
    it ended at, the summary records it, and stderr says that --steps sets the schedule."""
    settings = dataclasses.replace(SETTINGS, steps=50, warmup=1, eval_every=100, max_minutes=1e-9)
    summary = train.train(tmp_path / "clock", settings, SHAPE, device="cpu", roots=roots, progress=False)
    stopped = [r for r in read_log(tmp_path / "clock") if r["event"] == "stopped"][0]
    assert stopped["step"] == 0 and stopped["reason"] == "max_minutes=1e-09 reached"
    assert stopped["lr"] == pytest.approx(train.learning_rate(0, settings)) and stopped["schedule_steps"] == 50
    assert summary["steps"] == 1 and summary["schedule_steps"] == 50
    assert summary["last_lr"] == pytest.approx(settings.lr)  # the warm-up's one step: the full rate
    err = capsys.readouterr().err
    assert "stopped after step 0: max_minutes=1e-09 reached" in err
    assert "1 of the schedule's 50 steps" in err and "--steps sets the schedule's length" in err


def weights(folder) -> dict:
    return {k: v.float() for k, v in LlamaForCausalLM.from_pretrained(folder).state_dict().items()}


def test_init_continues_training_from_the_checkpoint(trained, roots, tmp_path):
    """--init: the run starts from the checkpoint's weights (with a learning rate of 1e-9, one step leaves them
    as they were, where a run from scratch ends far from them), draws batches of its own, and records what it
    continued, so a chain of runs adds up its steps."""
    from topo_attn.lm.init_weights import batch_seed

    out, summary = trained
    settings = dataclasses.replace(SETTINGS, steps=1, lr=1e-9, eval_every=100, init=str(out))
    seeds = []
    with pytest.MonkeyPatch.context() as patch:  # the batch stream's seed: the seed and the steps before
        patch.setattr(train, "batch_seed", lambda seed, init: seeds.append(batch_seed(seed, init)) or seeds[-1])
        first = train.train(tmp_path / "next", settings, SHAPE, device="cpu", roots=roots, progress=False)
    assert seeds == [[SETTINGS.seed, 3]]
    before, after = weights(out), weights(tmp_path / "next")
    assert all(torch.allclose(after[k], before[k], rtol=0, atol=1e-6) for k in before)
    scratch = dataclasses.replace(settings, init=None)
    train.train(tmp_path / "scratch", scratch, SHAPE, device="cpu", roots=roots, progress=False)
    fresh = weights(tmp_path / "scratch")
    # (from scratch: the seeded initialisation the checkpoint began from, 3 steps at lr 1e-3 behind it)
    assert max(float((fresh[k] - before[k]).abs().max()) for k in before) > 1e-3
    # its batches are not the first run's (a stream seeded by the seed and the steps before)
    log = read_log(tmp_path / "next")
    assert log[0]["init"] == {"path": str(out), "steps": 3, "bytes": summary["bytes"], "runs": 1}
    assert first["init"] == log[0]["init"] and log[0]["settings"]["init"] == str(out)
    rng_first = np.random.default_rng(SETTINGS.seed)  # the batch the first run began with
    stream = corpus.pack(corpus.split_sources(corpus.find_sources(roots))[0], seed=SETTINGS.seed)
    assert not torch.equal(train.training_batch(stream, settings, rng_first).ids,
                           train.training_batch(stream, settings, np.random.default_rng([SETTINGS.seed, 3])).ids)
    # a second continuation adds up the runs behind it
    again = train.train(tmp_path / "third", dataclasses.replace(settings, init=str(tmp_path / "next")), SHAPE,
                        device="cpu", roots=roots, progress=False)
    assert again["init"] == {"path": str(tmp_path / "next"), "steps": 4, "bytes": summary["bytes"] + first["bytes"],
                             "runs": 2}


def test_batch_seed():
    from topo_attn.lm.init_weights import InitModel, batch_seed

    assert batch_seed(3, None) == 3
    assert batch_seed(3, InitModel("m", {}, steps=40, bytes=0, runs=1)) == [3, 40]


def test_init_refuses_another_shape_context_or_evaluation_set_before_writing(trained, roots, tmp_path):
    out, _ = trained
    cases = [(dict(init=str(tmp_path / "nowhere")), SHAPE, "is not a model folder"),
             (dict(init=str(out)), dataclasses.replace(SHAPE, hidden=32, intermediate=64), "hidden_size=64"),
             (dict(init=str(out), seed=1), SHAPE, "evaluation set")]
    for values, shape, match in cases:
        target = tmp_path / f"out{len(match)}"
        with pytest.raises(ValueError, match=match):
            train.train(target, dataclasses.replace(SETTINGS, **values), shape, device="cpu", roots=roots,
                        progress=False)
        assert not target.exists()
    with pytest.raises(TypeError, match="init must be a model folder"):
        train.train(tmp_path / "x", dataclasses.replace(SETTINGS, init=3), SHAPE, device="cpu", roots=roots,
                    progress=False)
    # a longer context than the checkpoint's positions (the small corpus has no held-out file for one)
    from topo_attn.lm.init_weights import load_init

    with np.load(out / "eval_set.npz") as data:
        names, docs = list(data["names"]), data["documents"]
    with pytest.raises(ValueError, match="trained on 256 positions, fewer than this run's context of 512"):
        load_init(str(out), train.lm_config(SHAPE, 512), names, docs)
    assert load_init(str(out), train.lm_config(SHAPE, 256), names, docs).steps == 3


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


def test_lookup_weight_changes_the_training_only_through_the_lookup_bytes(roots, tmp_path):
    """--lookup-weight: a run that weighs the lookup bytes 50 times ends elsewhere than the plain run of the same
    seed (its batches held lookup bytes), while its logged plain loss starts from the same first step."""
    settings = dataclasses.replace(SETTINGS, steps=2, eval_every=100)
    train.train(tmp_path / "plain", settings, SHAPE, device="cpu", roots=roots, progress=False)
    heavy = dataclasses.replace(settings, lookup_weight=50.0)
    train.train(tmp_path / "heavy", heavy, SHAPE, device="cpu", roots=roots, progress=False)
    plain_log, heavy_log = read_log(tmp_path / "plain"), read_log(tmp_path / "heavy")
    plain_steps = [r for r in plain_log if r["event"] == "step"]
    heavy_steps = [r for r in heavy_log if r["event"] == "step"]
    assert plain_steps[0]["lookup_bytes"] > 0 and heavy_steps[0]["lookup_bytes"] == plain_steps[0]["lookup_bytes"]
    assert heavy_steps[0]["bits_per_byte"] == plain_steps[0]["bits_per_byte"]  # the same weights, the same batch
    assert heavy_log[0]["settings"]["lookup_weight"] == 50.0
    a, b = weights(tmp_path / "plain"), weights(tmp_path / "heavy")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) > 1e-4
