"""The copy content of training windows (topo_attn.lm.training_copies) and the batches that carry it
(topo_attn.lm.train.training_batch): only the training formats of the retrieval tasks, never a held-out format's
syntax (patterns written here by hand, independent of the module's templates), every task and training format
drawn, each answer a copy of the text ``distance`` bytes earlier, seeded, and clear argument errors."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch
from helpers import write_corpus

from topo_attn.lm import corpus, retrieval, train
from topo_attn.lm.train import TrainSettings
from topo_attn.lm.training_copies import MIN_SEGMENT, copy_window, segment_lengths, task_weights, training_options

NAME = r"[A-Za-z_][A-Za-z0-9_]*"
HELD_OUT_SYNTAX = {
    "dict": rf'config\["{NAME}"\]: ',
    "arrow": rf"# {NAME} (->|=>) ",
    "attribute": rf"self\.{NAME} = |assert self\.{NAME} == ",
    "annotated": rf"{NAME}: int = |print\({NAME}\)  # ",
    "js": rf"let {NAME} = |console\.assert\({NAME} === ",
    "go": rf"{NAME} := |fmt\.Println\({NAME}\)  // ",
}
"""What a line or question of each held-out format looks like (by hand, from the issue's formats)."""


@pytest.fixture(scope="module")
def stream(tmp_path_factory) -> np.ndarray:
    """Python-like training text (tests/helpers.write_corpus packed as train() packs it): no held-out syntax."""
    root = tmp_path_factory.mktemp("copies") / "lib"
    write_corpus(root, 400)
    data = corpus.pack(corpus.find_sources([("stdlib", root)]), seed=0)
    for name, pattern in HELD_OUT_SYNTAX.items():  # a precondition: the filler itself is clean
        assert not re.search(pattern.encode(), data.tobytes()), name
    return data


def windows(stream: np.ndarray, count: int, length: int, copies: int, seed: int = 0, *weights):
    """``count`` seeded windows (``weights``, when given, passed on to ``copy_window``)."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        start = int(rng.integers(0, len(stream) - 2 * length))
        yield copy_window(stream[start:start + 2 * length], length, rng, copies, *weights)


@pytest.fixture(scope="module")
def drawn(stream):
    return list(windows(stream, 120, 2049, 4)) + list(windows(stream, 20, 8193, 2, seed=1))


def test_held_out_syntax_is_recognised():
    """The hand-written patterns cover every held-out format and match its probes, so the test below can fail."""
    held_out = {name for task in retrieval.TASKS for name in retrieval.held_out_formats(task)}
    assert set(HELD_OUT_SYNTAX) == held_out
    filler = b"".join(f"def f{i}(x):\n    return x + {i}\n\n".encode() for i in range(200))
    for task in retrieval.TASKS:
        options = dict(budget=2, block_size=16) if task == "single_needle" else {}
        for name in retrieval.held_out_formats(task):
            probe = retrieval.TASKS[task](filler, 300, 1500, 0, name, **options)
            assert re.search(HELD_OUT_SYNTAX[name].encode(), probe.ids.tobytes()), (task, name)
        for name in retrieval.training_formats(task):  # and no training probe looks held out
            probe = retrieval.TASKS[task](filler, 300, 1500, 0, name, **options)
            text = probe.ids.tobytes()
            assert not any(re.search(p.encode(), text) for p in HELD_OUT_SYNTAX.values()), (task, name)


def test_copy_content_uses_only_training_formats_and_never_held_out_syntax(drawn):
    seen = set()
    for window in drawn:
        text = window.ids.tobytes()
        for name, pattern in HELD_OUT_SYNTAX.items():
            assert not re.search(pattern.encode(), text), f"held-out format {name} in a training window"
        for probe in window.probes:
            assert probe.format in retrieval.training_formats(probe.task), (probe.task, probe.format)
            seen.add((probe.task, probe.format))
    # every training format of every task is drawn
    assert seen == {(task, name) for task in retrieval.TASKS for name in retrieval.training_formats(task)}


def test_the_answer_is_a_copy_at_the_stated_distance(drawn):
    for window in drawn:
        assert window.ids.dtype == np.uint8 and window.ids.shape in ((2049,), (8193,))
        assert len(window.probes) >= 1 and len(window.offsets) == len(window.probes)
        ends = 0
        for probe, offset in zip(window.probes, window.offsets.tolist()):
            assert offset >= ends  # segments in order, not overlapping
            ends = offset + len(probe.ids)
            assert np.array_equal(window.ids[offset:ends], probe.ids)  # the probe sits there whole
            targets = offset + probe.targets
            answer = window.ids[targets].tobytes()
            assert answer == probe.answer and targets[-1] < len(window.ids)
            fmt = retrieval.FORMATS[probe.task][probe.format]
            first = answer.split(fmt.sep.encode())[0] if probe.task == "multi_value" else answer
            back = int(targets[0]) - probe.distance
            assert back >= offset  # earlier in the window, within the probe's segment
            assert window.ids[back:back + len(first)].tobytes() == first, (probe.task, probe.format)
            needle = offset + probe.needles[0]
            assert needle[0] <= back < needle[1]  # ... inside the needle line
    distances = [p.distance for w in drawn for p in w.probes]
    assert min(distances) < 256 and max(distances) > 6000  # short and long reaches


def test_seeded(stream):
    a = list(windows(stream, 5, 4097, 3, seed=7))
    b = list(windows(stream, 5, 4097, 3, seed=7))
    c = list(windows(stream, 5, 4097, 3, seed=8))
    assert all(np.array_equal(x.ids, y.ids) and np.array_equal(x.offsets, y.offsets) for x, y in zip(a, b))
    assert [(p.task, p.format, p.distance) for w in a for p in w.probes] == \
        [(p.task, p.format, p.distance) for w in b for p in w.probes]
    assert not all(np.array_equal(x.ids, y.ids) for x, y in zip(a, c))


def test_segments_and_options():
    rng = np.random.default_rng(0)
    for length, copies in ((8193, 4), (1000, 4), (600, 3), (257, 4), (100, 2), (5000, 1)):
        lengths = segment_lengths(length, copies, rng)
        assert lengths.sum() == length and len(lengths) == min(copies, max(1, length // MIN_SEGMENT))
        assert len(lengths) == 1 or lengths.min() >= MIN_SEGMENT
    big = [training_options("single_needle", 8193, rng) for _ in range(200)]
    assert max(o["decoys"] for o in big) == 32 and all(o["budget"] == o["decoys"] - 1 for o in big)
    assert max(training_options("single_needle", 300, rng)["decoys"] for _ in range(50)) == 1
    assert {training_options("multi_key", 8193, rng)["keys"] for _ in range(300)} == set(range(2, 17))


def test_a_segment_too_short_for_any_probe_stays_plain(stream):
    window = copy_window(stream[:40], 20, np.random.default_rng(0))
    assert window.probes == () and window.ids.tobytes() == stream[:20].tobytes()


@pytest.mark.parametrize("call, error, text", [
    (lambda s: copy_window(list(s[:100]), 50, np.random.default_rng(0)), TypeError, "filler must be a uint8"),
    (lambda s: copy_window(s[:100].astype(np.int64), 50, np.random.default_rng(0)), TypeError, "filler must be"),
    (lambda s: copy_window(s[:100].reshape(10, 10), 50, np.random.default_rng(0)), ValueError, "one-dimensional"),
    (lambda s: copy_window(s[:100], 200, np.random.default_rng(0)), ValueError, "at least length=200"),
    (lambda s: copy_window(s[:100], 0, np.random.default_rng(0)), ValueError, "length must be >= 1"),
    (lambda s: copy_window(s[:100], 50, np.random.default_rng(0), 0), ValueError, "copies must be >= 1"),
    (lambda s: copy_window(s[:100], 50, np.random.default_rng(0), 1.5), TypeError, "copies must be an int"),
    (lambda s: training_options("passkey", 100, np.random.default_rng(0)), ValueError, "task must be one of"),
])
def test_errors_name_the_argument(stream, call, error, text):
    with pytest.raises(error, match=text):
        call(stream)


# ---------------------------------------------------------------------------------------- training batches
def test_training_batch_windows_and_copy_share(stream):
    text = stream.tobytes()
    plain = TrainSettings(context=512, batch=6, copy_fraction=0.0)
    batch = train.training_batch(stream, plain, np.random.default_rng(1)).ids
    assert batch.shape == (6, 513) and batch.dtype == torch.int64
    for row in batch.numpy().astype(np.uint8):  # each row a window of the stream
        assert row.tobytes() in text
    assert torch.equal(batch, train.training_batch(stream, plain, np.random.default_rng(1)).ids)
    assert not torch.equal(batch, train.training_batch(stream, plain, np.random.default_rng(2)).ids)
    assert not train.training_batch(stream, plain, np.random.default_rng(1)).lookups.any()  # no copy content
    every = TrainSettings(context=512, batch=6, copy_fraction=1.0, max_copies=2)
    batch = train.training_batch(stream, every, np.random.default_rng(3)).ids
    assert batch.shape == (6, 513) and int(batch.min()) >= 0 and int(batch.max()) < 256
    assert all(row.tobytes() not in text for row in batch.numpy().astype(np.uint8))
    assert torch.equal(batch, train.training_batch(stream, every, np.random.default_rng(3)).ids)
    # the share: about copy_fraction of the rows carry copy content
    half = TrainSettings(context=256, batch=200, copy_fraction=0.5)
    rows = train.training_batch(stream, half, np.random.default_rng(4)).ids.numpy().astype(np.uint8)
    changed = sum(row.tobytes() not in text for row in rows)
    assert 70 <= changed <= 130


def test_lookup_positions_start_each_value_of_the_answer(drawn):
    """A window's lookup positions are, per probe, the answer bytes that start a value: the first answer byte,
    and in multi_value each byte right after the format's separator (read from the text, not from the probe's
    lookups)."""
    for window in drawn:
        expected = []
        for probe, offset in zip(window.probes, window.offsets.tolist()):
            targets = offset + probe.targets
            starts = [0]
            if probe.task == "multi_value":
                sep = retrieval.FORMATS[probe.task][probe.format].sep.encode()
                answer = window.ids[targets].tobytes()
                starts += [m.end() for m in re.finditer(re.escape(sep), answer)]
            expected += [int(targets[i]) for i in starts]
        assert window.lookup_positions.dtype == np.int64
        assert window.lookup_positions.tolist() == expected


def test_training_batch_marks_the_lookup_bytes_where_they_are_predicted(stream):
    settings = TrainSettings(context=1024, batch=8, copy_fraction=0.75, max_copies=3)
    batch = train.training_batch(stream, settings, np.random.default_rng(5))
    rng = np.random.default_rng(5)  # the same draws, replayed by hand: windows, then each row's copy content
    starts = rng.integers(0, len(stream) - 1025, 8)
    assert batch.lookups.shape == (8, 1024) and batch.lookups.dtype == torch.bool
    copied = 0
    for i, start in enumerate(starts.tolist()):
        marked = torch.nonzero(batch.lookups[i]).flatten().numpy()
        if rng.random() < settings.copy_fraction:
            copies = int(rng.integers(1, settings.max_copies + 1))
            window = copy_window(stream[start:start + 2050], 1025, rng, copies)
            assert np.array_equal(window.ids, batch.ids[i].numpy().astype(np.uint8))
            # position j of ids[:, 1:] is byte j + 1 of the window: the logits at j predict it
            assert np.array_equal(marked + 1, window.lookup_positions)
            copied += len(window.probes) > 0
        else:
            assert len(marked) == 0
    assert copied >= 2  # the test sees copy content


def test_training_loss_weights_the_lookup_bytes_only():
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 256, dtype=torch.float64)
    ids = torch.randint(0, 256, (2, 7))
    lookups = torch.zeros(2, 6, dtype=torch.bool)
    lookups[0, 2] = lookups[1, 5] = True
    batch = train.TrainingBatch(ids, lookups)
    each = [[-torch.log_softmax(logits[b, j], -1)[ids[b, j + 1]] for j in range(6)] for b in range(2)]
    plain = sum(sum(row) for row in each) / 12
    for weight in (1.0, 5.0, 0.0):
        result = train.training_loss(logits, batch, weight)
        weighted = sum(each[b][j] * (weight if lookups[b, j] else 1.0) for b in range(2) for j in range(6)) / 12
        assert float(result["loss"]) == pytest.approx(float(weighted), rel=1e-6)
        assert float(result["plain"]) == pytest.approx(float(plain), rel=1e-6)
        assert float(result["lookup_sum"]) == pytest.approx(float(each[0][2] + each[1][5]), rel=1e-6)
        assert int(result["lookups"]) == 2


@pytest.mark.parametrize("bad, error, text", [
    (dict(copy_fraction=-0.1), ValueError, r"copy_fraction must be in \[0, 1\].*got -0.1"),
    (dict(copy_fraction=1.5), ValueError, r"copy_fraction must be in \[0, 1\]"),
    (dict(copy_fraction=float("nan")), ValueError, r"copy_fraction must be in \[0, 1\]"),
    (dict(copy_fraction="0.5"), TypeError, "copy_fraction must be a number"),
    (dict(copy_fraction=True), TypeError, "copy_fraction must be a number"),
    (dict(max_copies=0), ValueError, "max_copies must be >= 1"),
    (dict(max_copies=2.0), TypeError, "max_copies must be an int"),
    (dict(lookup_weight=-1.0), ValueError, "lookup_weight must be a finite number >= 0.*got -1.0"),
    (dict(lookup_weight=float("inf")), ValueError, "lookup_weight must be a finite number"),
    (dict(lookup_weight=float("nan")), ValueError, "lookup_weight must be a finite number"),
    (dict(lookup_weight="8"), TypeError, "lookup_weight must be a finite number"),
    (dict(copy_tasks="multi_value"), ValueError, "copy_tasks must be TASK=WEIGHT pairs.*got 'multi_value'"),
    (dict(copy_tasks="multi_values=2"), ValueError, "copy_tasks must be TASK=WEIGHT"),
    (dict(copy_tasks="multi_value=-1"), ValueError, "copy_tasks must be TASK=WEIGHT"),
    (dict(copy_tasks="multi_value=inf"), ValueError, "copy_tasks must be TASK=WEIGHT"),
    (dict(copy_tasks="multi_value=x"), ValueError, "copy_tasks must be TASK=WEIGHT"),
    (dict(copy_tasks="multi_value=1,multi_value=2"), ValueError, "copy_tasks must be TASK=WEIGHT"),
    (dict(copy_tasks=",".join(f"{t}=0" for t in retrieval.TASKS)), ValueError, "copy_tasks must leave some task"),
    (dict(copy_tasks=3), TypeError, "copy_tasks must be a string"),
])
def test_copy_settings_are_checked(bad, error, text):
    with pytest.raises(error, match=text):
        train.check_settings(dataclasses.replace(TrainSettings(), **bad))
    with pytest.raises(error, match=text.replace(next(iter(bad)), train.option(next(iter(bad))))):
        train.check_settings(dataclasses.replace(TrainSettings(), **bad), train.option)
    for good in (0.0, 0.25, 1, 1.0):
        train.check_settings(TrainSettings(copy_fraction=good))
        train.check_settings(TrainSettings(lookup_weight=good * 10))


def test_task_weights_parse_to_probabilities():
    tasks = list(retrieval.TASKS)
    assert task_weights(None) is None
    weights = task_weights("multi_value=3, variable_tracking=0")
    expected = np.array([0.0 if t == "variable_tracking" else 3.0 if t == "multi_value" else 1.0 for t in tasks])
    assert np.allclose(weights, expected / expected.sum())
    only = task_weights(",".join(f"{t}={int(t == 'multi_key')}" for t in tasks))
    assert only.tolist() == [float(t == "multi_key") for t in tasks]


def test_copy_window_draws_the_tasks_by_their_weights(stream):
    """A weight of 0 never draws its task; the uniform draw (no weights) is the one before weights existed,
    draw for draw; and the weighted shares follow the weights."""
    def count(weights, seed):
        return [p.task for window in windows(stream, 60, 2049, 4, seed, weights) for p in window.probes]

    def texts(*weights):
        return [[p.ids.tobytes() for p in window.probes] for window in windows(stream, 30, 2049, 4, 3, *weights)]

    only = task_weights("multi_value=1," + ",".join(f"{t}=0" for t in retrieval.TASKS if t != "multi_value"))
    assert set(count(only, 0)) == {"multi_value"}
    assert texts() == texts(None)
    skewed = count(task_weights("multi_value=6"), 1)  # multi_value 6/10 of the draws that fit
    share = skewed.count("multi_value") / len(skewed)
    assert len(skewed) >= 100 and 0.45 <= share <= 0.75, (len(skewed), share)
    assert set(skewed) == set(retrieval.TASKS)


def test_training_batch_uses_the_task_weights(stream):
    settings = TrainSettings(context=1024, batch=8, copy_fraction=1.0, max_copies=3, copy_tasks="multi_key=1,"
                             + ",".join(f"{t}=0" for t in retrieval.TASKS if t != "multi_key"))
    rng = np.random.default_rng(7)
    batch = train.training_batch(stream, settings, rng)
    replay = np.random.default_rng(7)
    starts = replay.integers(0, len(stream) - 1025, 8)
    for i, start in enumerate(starts.tolist()):
        assert replay.random() < 1.0
        copies = int(replay.integers(1, 4))
        window = copy_window(stream[start:start + 2050], 1025, replay, copies, task_weights(settings.copy_tasks))
        assert {p.task for p in window.probes} <= {"multi_key"}
        assert np.array_equal(window.ids, batch.ids[i].numpy().astype(np.uint8))
