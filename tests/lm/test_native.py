"""Native sparse training (issue 42, item 2) on the test device (the CPU with the kit's Triton kernels in the
interpreter, or a GPU with them compiled):
``python -m topo_attn.lm train --attention SELECTOR --budget B`` trains through the kit's backend from the first
step (its kernels ran, forward and backward; each layer chose its blocks from its own queries and keys at every
step; every weight got a gradient), ``--attention sdpa`` without copy content trains as the commit before it
did, byte for byte,
bad values are one-line usage errors, and ``python -m topo_attn.lm native`` runs end to end and writes its
JSON."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import subprocess
import sys
import types

import numpy as np
import pytest
import torch
from helpers import DEVICE, write_train_corpus

from topo_attn import cli
from topo_attn.lm import native, probe, train
from topo_attn.lm.evaluate import bits_per_byte, token_losses
from topo_attn.lm.results import load_lm_native
from topo_attn.lm.train import TRAIN_BACKEND, ModelShape, TrainSettings
from topo_attn.provenance import ROOT

transformers = pytest.importorskip("transformers", minversion="5")
from transformers import LlamaForCausalLM  # noqa: E402

from topo_attn.integrations import transformers as tat  # noqa: E402
from topo_attn.lm.__main__ import PROG  # noqa: E402
from topo_attn.lm.__main__ import main as lm_main  # noqa: E402

SHAPE = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128)
# context 256, the shortest train() takes (a passkey probe must fit): 8 blocks of 32, so n/8 is a budget of 1
SETTINGS = TrainSettings(context=256, batch=2, steps=2, stop_after=None, warmup=1, eval_every=100, eval_documents=2,
                         log_every=1, seed=0, block_size=32)
BLOCKS = 8
BEFORE = "35eaaf8"  # the last commit that changed topo_attn/lm/train.py before native training


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    return write_train_corpus(tmp_path_factory.mktemp("corpus"))


def root_options(roots) -> list[str]:
    """``--root KIND=PATH`` for each of ``roots``."""
    return [a for kind, path in roots for a in ("--root", f"{kind}={path}")]


def read_log(out) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def per_row(blocks: int, visited: int) -> float:
    """Scheduled / causal block pairs when row ``r`` visits ``min(r + 1, visited)`` blocks."""
    return sum(min(r + 1, visited) for r in range(blocks)) / (blocks * (blocks + 1) // 2)


@pytest.fixture(scope="module")
def sparse_run(tmp_path_factory, roots):
    """``quest`` training at n/8 with every selection, every kernel call and every step's gradients recorded."""
    records = dict(select=[], kernel=[], grads=[])
    select, kernel, clip = tat.select, tat.scheduled_attention, torch.nn.utils.clip_grad_norm_

    def recording_select(*args, **kwargs):
        schedule = select(*args, **kwargs)
        records["select"].append((args, kwargs, schedule))
        return schedule

    def recording_kernel(query, key, value, schedule, **kwargs):
        records["kernel"].append((query.detach().clone(), key.detach().clone(), schedule, query.requires_grad))
        return kernel(query, key, value, schedule, **kwargs)

    def recording_clip(parameters, max_norm):
        parameters = list(parameters)
        records["grads"].append([None if p.grad is None else p.grad.detach().clone() for p in parameters])
        return clip(parameters, max_norm)

    out = tmp_path_factory.mktemp("quest") / "model"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tat, "select", recording_select)
        patch.setattr(tat, "scheduled_attention", recording_kernel)
        patch.setattr(torch.nn.utils, "clip_grad_norm_", recording_clip)
        summary = train.train(out, dataclasses.replace(SETTINGS, attention="quest"), SHAPE, device=DEVICE,
                              roots=roots, progress=False)
    return dict(out=out, summary=summary, records=records, stats=tat.last_stats(TRAIN_BACKEND),
                registered=tat.registered(TRAIN_BACKEND))


# ------------------------------------------------------------------------------------- training through the kit
def test_sparse_training_runs_the_kits_kernels(sparse_run):
    summary, stats = sparse_run["summary"], sparse_run["stats"]
    assert summary["attention"] == "quest" and summary["budget"] == 1  # n/8 of 8 blocks
    assert (sparse_run["registered"].selector, sparse_run["registered"].budget) == ("quest", 1)
    # the backend's last call per layer: the kernels over quest's schedule (sink, window, diagonal and 1 more)
    assert sorted(stats) == [0, 1]
    for layer in stats.values():
        assert layer.path == "kernel" and layer.q_len == SETTINGS.context
        assert layer.visited_fraction == pytest.approx(per_row(BLOCKS, 4))
    assert summary["visited_fraction"] == pytest.approx(per_row(BLOCKS, 4)) and summary["visited_fraction"] < 1
    # the loss is finite and the run is logged as a quest run
    steps = [r for r in read_log(sparse_run["out"]) if r["event"] == "step"]
    assert [r["step"] for r in steps] == [0, 1]
    assert all(math.isfinite(r["bits_per_byte"]) and 0 < r["bits_per_byte"] < 12 for r in steps)
    assert math.isfinite(summary["bits_per_byte"]["all"])
    assert read_log(sparse_run["out"])[0]["settings"]["attention"] == "quest"
    assert summary["train_seconds"] > 0 and 0 < summary["first_step_seconds"] <= summary["train_seconds"]


def test_each_layer_selects_from_its_own_queries_and_keys_at_every_step(sparse_run):
    records = sparse_run["records"]
    selections, kernels = records["select"], records["kernel"]
    # one selection per kernel call, each the schedule that call ran, chosen from the query and key it received
    assert len(selections) == len(kernels) > 0
    for (args, kwargs, schedule), (query, key, ran, _) in zip(selections, kernels):
        name, q, k, block_size, sinks, window, budget = args
        assert (name, block_size, sinks, window, budget) == ("quest", 32, 1, 1, 1) and not kwargs
        assert ran is schedule
        assert not q.requires_grad and torch.equal(q, query) and torch.equal(k, key)
    # the training steps: batch 2 with gradients, one call per layer and step, each chosen afresh
    training = [i for i, (query, _, _, grad) in enumerate(kernels) if grad]
    assert training == list(range(SETTINGS.steps * SHAPE.layers))
    assert all(kernels[i][0].shape[0] == SETTINGS.batch for i in training)
    step0, step1 = kernels[0:2], kernels[2:4]
    for first, second in zip(step0, step1):  # the same layer at the next step: new queries (new weights, batch)
        assert not torch.equal(first[0], second[0]) and first[2] is not second[2]
    assert not torch.equal(step0[0][0], step0[1][0])  # layer 1 does not reuse layer 0's queries


def test_gradients_reach_every_weight(sparse_run, roots):
    grads = sparse_run["records"]["grads"]
    assert len(grads) == SETTINGS.steps
    names = [n for n, _ in LlamaForCausalLM(train.lm_config(SHAPE, SETTINGS.context)).named_parameters()]
    for step in grads:
        assert len(step) == len(names)
        for name, grad in zip(names, step):
            assert grad is not None and bool(torch.isfinite(grad).all()), name
            assert float(grad.abs().sum()) > 0, name  # q_proj and k_proj only through the kernel's dq and dk
    assert any("q_proj" in n for n in names) and any("k_proj" in n for n in names)


def test_the_checkpoint_loads_without_the_backend(sparse_run):
    model = LlamaForCausalLM.from_pretrained(sparse_run["out"]).eval()
    assert model.config._attn_implementation == "sdpa"
    assert TRAIN_BACKEND not in (sparse_run["out"] / "config.json").read_text()


def test_a_training_step_through_the_kits_dense_kernels_matches_sdpa():
    """The kit's ``dense`` (every causal block) trains as SDPA does: equal loss and gradients (float32)."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(train.lm_config(SHAPE, 128)).to(DEVICE)
    ids = torch.randint(0, 256, (2, 129), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    grads = {}
    for attention in ("sdpa", "dense"):
        model.zero_grad(set_to_none=True)
        settings = dataclasses.replace(SETTINGS, context=128, attention=attention, block_size=16)
        assert train.use_attention(model, settings) == (None if attention == "sdpa" else TRAIN_BACKEND)
        logits = model(ids[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), ids[:, 1:])
        loss.backward()
        grads[attention] = (float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters()})
        model.set_attn_implementation("sdpa")
    assert tat.last_stats(TRAIN_BACKEND)[0].path == "kernel"
    assert grads["dense"][0] == pytest.approx(grads["sdpa"][0], rel=1e-5)
    for name, grad in grads["sdpa"][1].items():
        torch.testing.assert_close(grads["dense"][1][name], grad, rtol=1e-3, atol=1e-5, msg=name)


# ----------------------------------------------------------------------------------- sdpa: the old path
def old_train_module() -> types.ModuleType:
    """``topo_attn/lm/train.py`` as of :data:`BEFORE`, loaded as a module of ``topo_attn.lm`` (the caller
    provides ``probe.insert_copies``, gone since, which it imports)."""
    shown = subprocess.run(["git", "show", f"{BEFORE}:topo_attn/lm/train.py"], cwd=ROOT, capture_output=True,
                           text=True)
    if shown.returncode != 0:  # as tests/test_provenance.py: a checkout without this history cannot compare
        pytest.skip(f"no git history holding commit {BEFORE}: {shown.stderr.strip()}")
    name = "topo_attn.lm._train_before_native"
    module = types.ModuleType(name)
    module.__package__ = "topo_attn.lm"
    sys.modules[name] = module
    exec(compile(shown.stdout, f"topo_attn/lm/train.py@{BEFORE}", "exec"), module.__dict__)
    return module


def test_sdpa_training_is_the_old_training_byte_for_byte(roots, tmp_path, monkeypatch, capsys):
    """Without copy content (whose formats changed since, issue 41) the training steps are the old ones; the
    evaluation set (now one window per file) and so the final validation differ."""
    monkeypatch.setattr(probe, "insert_copies", lambda *a: pytest.fail("copy content drawn"), raising=False)
    old = old_train_module()
    assert not hasattr(old.TrainSettings(), "attention")  # really the code before native training
    settings = dataclasses.replace(SETTINGS, copy_fraction=0.0)
    fields = {f.name: getattr(settings, f.name) for f in dataclasses.fields(old.TrainSettings)
              if hasattr(settings, f.name)}
    old.train(tmp_path / "old", old.TrainSettings(**fields), SHAPE, device="cpu", roots=roots, progress=False)
    calls = []
    monkeypatch.setattr(tat, "scheduled_attention", lambda *a, **k: calls.append(a) or pytest.fail("kit ran"))
    # the command line with --attention sdpa, and the library's default settings
    argv = ["train", "--out", str(tmp_path / "cli"), "--device", "cpu", *root_options(roots),
            "--attention", "sdpa", "--stop-after", "0"]
    for field in ("context", "batch", "steps", "warmup", "eval_every", "eval_documents", "log_every", "seed",
                  "copy_fraction", "layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate"):
        value = getattr(settings, field) if hasattr(settings, field) else getattr(SHAPE, field)
        argv += [train.option(field), str(value)]
    assert cli.run(lm_main, argv, prog=PROG) == 0
    assert json.loads(capsys.readouterr().out)["attention"] == "sdpa"
    train.train(tmp_path / "library", settings, SHAPE, device="cpu", roots=roots, progress=False)
    assert calls == []
    weights = (tmp_path / "old" / "model.safetensors").read_bytes()
    old_steps = [r["bits_per_byte"] for r in read_log(tmp_path / "old") if r["event"] == "step"]
    finals = []
    for run in ("cli", "library"):
        assert (tmp_path / run / "model.safetensors").read_bytes() == weights, run
        log = read_log(tmp_path / run)
        assert [r["bits_per_byte"] for r in log if r["event"] == "step"] == old_steps, run
        assert log[-1]["attention"] == "sdpa" and log[-1]["budget"] is None and log[-1]["visited_fraction"] is None
        finals.append((log[-1]["bits_per_byte"], log[-1]["passkey"]))
    assert finals[0] == finals[1]  # the command line and the library: the same evaluation too


# ------------------------------------------------------------------------------------------ usage errors
BAD_TRAIN = [
    (["--attention", "random"], "--attention", "'random'"),
    (["--attention", "flash"], "--attention", "must be one of"),
    (["--attention", "sdpa", "--budget", "4"], "--budget", "visits every causal block"),
    (["--attention", "dense", "--budget", "4"], "--budget", "visits every causal block"),
    (["--attention", "window", "--budget", "2"], "--budget", "adds no blocks"),
    (["--attention", "quest", "--budget", "-1"], "--budget", ">= 0"),
    (["--attention", "quest", "--budget", "x"], "--budget", "invalid int value"),
    (["--attention", "quest", "--block-size", "48"], "--block-size", "power of two >= 16"),
]
BAD_NATIVE = [
    (["--attentions", "sdpa", "oracle"], "--attentions", "'oracle'"),
    (["--attentions", "quest", "quest"], "--attentions", "twice"),
    (["--budget", "-1"], "--budget", ">= 0"),
    (["--budget", "two"], "--budget", "invalid int value"),
    (["--documents", str(TrainSettings().eval_documents + 1)], "--documents", "--eval-documents"),
    (["--block-size", "8"], "--block-size", "power of two"),
    (["--out", "/nonexistent/folder/x.json"], "--out", "existing folder"),
    (["--suite-probes", "-1"], "--suite-probes", ">= 0"),
    (["--suite-distances", "0"], "--suite-distances", ">= 1"),
    (["--suite-distances", "8192"], "--suite-distances", "do not fit --context 8192"),
    (["--suite-tasks", "haystack"], "--suite-tasks", "invalid choice"),
    (["--compare", "sdpa"], "--compare", "must be one of"),
    (["--compare", "oracle"], "--compare", "must be one of"),
]


@pytest.mark.parametrize("args, option, text", [(["train", "--out", "/nonexistent/out", *a], o, t)
                                                for a, o, t in BAD_TRAIN] +
                         [(["native", "--out", "x.json", *a], o, t) for a, o, t in BAD_NATIVE],
                         ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_attention_and_budget_are_one_line_usage_errors(args, option, text, capsys):
    capsys.readouterr()
    try:
        code = cli.run(lm_main, [*args, "--device", "cpu"], prog=PROG)
    except SystemExit as done:  # argparse's own errors (a value that is not an int)
        code = done.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err
    assert lines[0].startswith(PROG) and ": error: " in lines[0] and option in lines[0] and text in lines[0], err
    assert len(lines) == 1 or (len(lines) == 2 and "--help" in lines[1]), err  # argparse adds where the help is


def test_train_rejects_a_bad_attention_before_any_work(tmp_path, roots):
    for bad, error, text in ((dict(attention="oracle"), ValueError, "attention must be one of"),
                             (dict(attention=None), TypeError, "attention must be a str"),
                             (dict(attention="quest", budget=-1), ValueError, "budget must be >= 0"),
                             (dict(attention="quest", budget=1.5), TypeError, "budget must be an int"),
                             (dict(attention="sdpa", budget=2), ValueError, "leave budget unset"),
                             (dict(attention="centroid", block_size=24), ValueError, "block_size must be a power"),
                             (dict(attention="centroid", sinks=-1), ValueError, "sinks must be >= 0")):
        with pytest.raises(error, match=text):
            train.train(tmp_path / "never", dataclasses.replace(SETTINGS, **bad), SHAPE, device="cpu", roots=roots,
                        progress=False)
        assert not (tmp_path / "never").exists()


def test_budget_defaults_to_n_over_8():
    assert train.attention_budget(TrainSettings(attention="quest")) == 16  # 8192 / 64 = 128 blocks; n/8 = 16
    assert train.attention_budget(TrainSettings(attention="topology_22", block_size=128)) == 8
    assert train.attention_budget(TrainSettings(attention="centroid", budget=3)) == 3
    assert train.attention_budget(TrainSettings(attention="window")) == 0
    assert train.attention_budget(TrainSettings()) is None and train.attention_budget(
        TrainSettings(attention="dense")) is None
    assert train.attention_budget(TrainSettings(attention="quest", context=1000, block_size=16)) == 7  # 63 blocks
    # the committed model's settings are unchanged: SDPA, no budget
    assert TrainSettings().attention == "sdpa" and TrainSettings().budget is None


# --------------------------------------------------------------------------------------- the native study
def native_argv(out, models, roots, *attentions) -> list[str]:
    """The smoke run's command line (tiny model, 2 steps at context 256, on the test device) for ``attentions``."""
    return ["native", "--out", str(out), "--models", str(models), "--attentions", *attentions,
            "--device", DEVICE, *root_options(roots), "--context", "256", "--batch", "1", "--steps", "2",
            "--warmup", "1", "--eval-every", "100", "--eval-documents", "2", "--log-every", "1", "--block-size", "32",
            "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
            "--intermediate", "128", "--documents", "1", "--probes", "1", "--eval-batch", "1", "--no-progress",
            "--suite-probes", "2", "--suite-tasks", "plain_needle", "--suite-distances", "100"]


@pytest.fixture(scope="module")
def native_run(tmp_path_factory, roots):
    folder = tmp_path_factory.mktemp("native")
    out = folder / "lm_native_test.json"
    argv = native_argv(out, folder / "models", roots, "sdpa", "quest")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.run(lm_main, argv, prog=PROG) == 0
    return dict(folder=folder, out=out, printed=printed.getvalue(), result=json.loads(out.read_text()))


def test_native_writes_the_rows_and_the_provenance(native_run):
    result = native_run["result"]
    assert result["suite"] == "lm_native" and result["complete"] is True
    on_cpu = DEVICE == "cpu"
    assert result["gpu"] == ("cpu" if on_cpu else torch.cuda.get_device_name(DEVICE))
    assert result["torch"] == torch.__version__ and result["dtype"] == ("float32" if on_cpu else "bfloat16")
    assert result["transformers"] == transformers.__version__ and result["triton"]
    assert result["command"].startswith("python -m topo_attn.lm native --out ")
    assert {"commit", "commit_source", "date"} <= set(result) and result["seconds"] > 0
    assert result["attentions"] == ["sdpa", "quest"] and result["budgets"] == {"sdpa": None, "quest": 1}
    assert result["settings"]["context"] == 256 and result["settings"]["steps"] == 2
    assert result["shape"]["hidden"] == 64 and result["documents"] == 1 and result["length"] == 256
    rows = {r["attention"]: r for r in result["rows"]}
    assert list(rows) == ["sdpa", "quest"]
    for row in rows.values():
        assert list(row) == list(native.ROW_FIELDS)
        assert math.isfinite(row["bits_per_byte"]) and set(row["bits_per_byte_by_position"]) == {"0-1k"}
        assert row["bits_per_byte_by_position"]["0-1k"] == row["bits_per_byte"]  # one bucket holds every position
        assert row["steps"] == 2 and row["seconds"] > 0
        assert row["tokens_per_s"] == pytest.approx(2 * 256 / row["seconds"])  # batch 1
        assert row["tokens_per_s_after_first_step"] > 0 and row["run_seconds"] > row["seconds"]
        assert [p["distance"] for p in row["passkey"]] == [128] and row["passkey"][0]["probes"] == 1
        (cell,) = row["retrieval_suite"]  # one task at one distance, two probes
        assert (cell["task"], cell["distance"], cell["n"]) == ("plain_needle", 100, 2)
        assert cell["accuracy"] == row["retrieval_suite_accuracy"] in (0.0, 0.5, 1.0)
        assert cell["wilson_low"] <= cell["accuracy"] <= cell["wilson_high"]
    assert result["retrieval_suite"] == dict(probes_per_cell=2, tasks=["plain_needle"], distances=[100],
                                             formats="held_out", unscored=[])
    assert rows["sdpa"]["budget"] is None and rows["sdpa"]["visited_fraction"] == 1.0
    assert rows["sdpa"]["train_visited_fraction"] is None
    assert rows["quest"]["budget"] == 1 and rows["quest"]["visited_fraction"] == pytest.approx(per_row(BLOCKS, 4))
    assert rows["quest"]["train_visited_fraction"] == pytest.approx(per_row(BLOCKS, 4))
    (after,) = result["after_training"]
    assert list(after) == list(native.AFTER_FIELDS)
    assert (after["attention"], after["budget"], after["trained_with"]) == ("quest", 1, "sdpa")
    assert after["visited_fraction"] == pytest.approx(per_row(BLOCKS, 4))
    loaded = load_lm_native(native_run["out"])
    assert loaded["rows"] == result["rows"]
    table = native_run["printed"]
    assert "| sdpa |" in table and "| quest | 1 |" in table and f"{after['bits_per_byte']:.3f}" in table
    # the steady throughput (after the first step) and its ratio to SDPA's, per trained attention
    lines = {line.split(" | ")[0]: line.split(" | ") for line in table.splitlines()}
    head = lines["| attention"]
    for attention, row in rows.items():
        cells = dict(zip(head, lines[f"| {attention}"]))
        steady = row["tokens_per_s_after_first_step"]
        assert cells["tokens/s after step 1"] == f"{steady:.0f}"
        assert cells["/ sdpa"] == f"{steady / rows['sdpa']['tokens_per_s_after_first_step']:.2f}x"
    # one held-out document: its bits per byte are the row's, and the paired differences are single points
    for row in (*rows.values(), after):
        assert row["bits_per_byte_per_document"] == [pytest.approx(row["bits_per_byte"], rel=1e-6)]
    quest = dict(zip(head, lines["| quest"]))
    native_minus_after = rows["quest"]["bits_per_byte_per_document"][0] - after["bits_per_byte_per_document"][0]
    assert quest["native - after [95% CI]"] == f"{native_minus_after:+.3f} [{native_minus_after:+.3f}, " \
                                               f"{native_minus_after:+.3f}]"
    assert dict(zip(head, lines["| sdpa"]))["native - sdpa [95% CI]"] == ""


def test_the_table_gives_paired_intervals_over_the_documents():
    """With several documents, the native-minus-after and native-minus-SDPA cells are the paired bootstrap of
    topo_attn.lm.intervals over the per-document values; a file without them (an older one) leaves them blank."""
    from topo_attn.lm.intervals import paired_mean_difference

    rng = np.random.default_rng(8)
    base = rng.uniform(0.8, 1.2, 12)

    def row(attention, shift, **extra):
        values = list(base + shift + rng.normal(0, 0.01, 12))
        return dict(attention=attention, budget=None if attention == "sdpa" else 16, visited_fraction=0.27,
                    bits_per_byte=float(np.mean(values)), bits_per_byte_by_position={"0-1k": float(np.mean(values))},
                    bits_per_byte_per_document=values, tokens_per_s=1.0, steps=5, seconds=1.0, **extra)

    sdpa, native_quest, after_quest = row("sdpa", 0.0), row("quest", 0.05), row("quest", 0.08, trained_with="sdpa")
    result = dict(rows=[sdpa, native_quest], after_training=[after_quest])
    lines = {line.split(" | ")[0]: line.split(" | ") for line in native.markdown(result).splitlines()}
    cells = dict(zip(lines["| attention"], lines["| quest"]))
    for column, other in (("native - after [95% CI]", after_quest), ("native - sdpa [95% CI]", sdpa)):
        found = paired_mean_difference(native_quest["bits_per_byte_per_document"], other["bits_per_byte_per_document"])
        assert cells[column] == f"{found.difference:+.3f} [{found.ci_low:+.3f}, {found.ci_high:+.3f}]"
        assert found.ci_low < found.difference < found.ci_high
    older = dict(rows=[{k: v for k, v in r.items() if k != "bits_per_byte_per_document"} for r in result["rows"]],
                 after_training=result["after_training"])
    lines = {line.split(" | ")[0]: line.split(" | ") for line in native.markdown(older).splitlines()}
    cells = dict(zip(lines["| attention"], lines["| quest"]))
    assert cells["native - after [95% CI]"] == "" and cells["native - sdpa [95% CI]"] == ""


def checkpoint(folder, result: dict):
    """The saved model in ``folder`` as the run evaluated it: in its dtype, on its device, in eval mode."""
    return LlamaForCausalLM.from_pretrained(folder, dtype=getattr(torch, result["dtype"])).to(result["device"]).eval()


def test_native_scores_agree_with_the_evaluation_functions(native_run):
    """Each row's bits per byte are those of its saved checkpoint on the held-out documents, with the attention
    it was trained with (sdpa, quest), and the after-training row the SDPA-trained model's under quest."""
    result, models = native_run["result"], native_run["folder"] / "models"
    rows = {r["attention"]: r for r in result["rows"]}
    docs = torch.from_numpy(np.load(models / "sdpa" / "eval_set.npz")["documents"][:1].astype(np.int64))
    assert torch.equal(docs, torch.from_numpy(np.load(models / "quest" / "eval_set.npz")["documents"][:1]
                                              .astype(np.int64)))  # equal seeds and settings: equal documents
    name = tat.register(selector="quest", block_size=32, sinks=1, window=1, budget=1, name="native_check")
    for trained, attention, expected in (("sdpa", "sdpa", rows["sdpa"]), ("quest", name, rows["quest"]),
                                         ("sdpa", name, result["after_training"][0])):
        model = checkpoint(models / trained, result)
        model.set_attn_implementation(attention)
        bits = bits_per_byte(token_losses(model, docs))
        assert bits["all"] == pytest.approx(expected["bits_per_byte"], rel=1e-6), (trained, attention)
    assert rows["quest"]["bits_per_byte"] != rows["sdpa"]["bits_per_byte"]  # two models, trained differently


def test_native_retrieval_suite_agrees_with_the_suite_runner(native_run):
    """Each row's retrieval suite is the suite runner's own scoring of its checkpoint: the same held-out-format
    probes (seed --probe-seed, built into the held-out documents), sdpa at full attention, quest per token (no
    look-ahead), and the SDPA-trained model under quest for the after-training row."""
    from topo_attn.lm import retrieval_runner
    from topo_attn.lm.evaluate import passkey_scores
    from topo_attn.lm.token_attention import register_token_selection

    result, models = native_run["result"], native_run["folder"] / "models"
    docs = np.load(models / "sdpa" / "eval_set.npz")["documents"][:1]
    probes = retrieval_runner.build_probes(docs, ["plain_needle"], [100], 2, 1, 1, 32)
    assert len(probes) == 2 and all(p.distance == 100 for p in probes)
    rows = {r["attention"]: r for r in result["rows"]}
    token = register_token_selection("quest", 32, 1, 1, 1, name="native_suite_check")
    for trained, attention, expected in (("sdpa", "sdpa", rows["sdpa"]), ("quest", token, rows["quest"]),
                                         ("sdpa", token, result["after_training"][0])):
        model = checkpoint(models / trained, result)
        model.set_attn_implementation(attention)
        correct = [bool(r["exact"]) for r in passkey_scores(model, probes, batch=1)]
        assert expected["retrieval_suite_accuracy"] == sum(correct) / 2, (trained, attention)


def test_the_suite_scores_only_without_look_ahead():
    """topology_22 (a whole sequence's saliences) has no token form: native leaves its suite empty and the runner
    refuses it; window, sdpa and dense are scored per block, the token selectors per token."""
    from topo_attn.lm import retrieval_runner

    assert retrieval_runner.suite_granularity("topology_22") is None
    assert native.suite_fields(None, ["a probe"], "topology_22", 16, None) == dict(retrieval_suite=None,
                                                                                 retrieval_suite_accuracy=None)
    with pytest.raises(ValueError, match="without look-ahead"):
        retrieval_runner.score_probes(None, [], "topology_22", 16, None, 1)
    assert [retrieval_runner.suite_granularity(a) for a in ("sdpa", "dense", "window", "quest", "topology")] == [
        "block", "block", "block", "token", "token"]


def test_native_resume_adds_models_and_keeps_what_ran(native_run, tmp_path, roots, capsys):
    """``--resume`` adds a run's models to an earlier file of equal settings: its rows and after-training rows
    stay, the attentions it holds are not trained again, each run is listed; other settings are refused before
    anything is trained, and the file is left as it was."""
    out = tmp_path / "parts.json"
    out.write_text(native_run["out"].read_text())
    before = json.loads(out.read_text())
    argv = [*native_argv(out, tmp_path / "models", roots, "quest", "window"), "--resume"]
    assert cli.run(lm_main, argv, prog=PROG) == 0
    result = json.loads(out.read_text())
    assert [r["attention"] for r in result["rows"]] == ["sdpa", "quest", "window"]
    assert result["rows"][:2] == before["rows"] and result["after_training"] == before["after_training"]
    assert not (tmp_path / "models" / "quest").exists()  # held by the file: not trained again
    assert result["attentions"] == ["sdpa", "quest", "window"] and result["budgets"]["window"] == 0
    assert [r["attentions"] for r in result["runs"]] == [["sdpa", "quest"], ["quest", "window"]]
    assert result["complete"] is True and list(result["rows"][2]) == list(native.ROW_FIELDS)
    capsys.readouterr()
    other = [*native_argv(out, tmp_path / "other", roots, "centroid"), "--resume", "--steps", "3"]
    assert cli.run(lm_main, other, prog=PROG) == 2
    err = capsys.readouterr().err
    assert "argument --resume" in err and "settings" in err and "Traceback" not in err
    assert json.loads(out.read_text()) == result and not (tmp_path / "other").exists()


def test_compare_chooses_the_after_training_attentions(tmp_path, roots):
    """``--attentions sdpa --compare window``: one trained model, scored after training with window only."""
    out = tmp_path / "sdpa.json"
    argv = [*native_argv(out, tmp_path / "models", roots, "sdpa"), "--compare", "window"]
    assert cli.run(lm_main, argv, prog=PROG) == 0
    result = json.loads(out.read_text())
    assert [r["attention"] for r in result["rows"]] == ["sdpa"] and result["notes"] == []
    assert [(r["attention"], r["budget"]) for r in result["after_training"]] == [("window", 0)]
    assert result["budgets"] == {"sdpa": None, "window": 0}
