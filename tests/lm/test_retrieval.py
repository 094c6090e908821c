"""The RULER-style retrieval probes (topo_attn.lm.retrieval), per task and format, on real Python source and on
synthetic code full of look-alike lines: the answer is recovered from the prompt by a reference parser written
here (regular expressions per format, independent of the module's templates), the decoys exist and differ from
the answer, nothing placed leaks into the filler, distance and length are as asked, the filler is kept in
order, and the training and held-out formats are disjoint (no held-out line parses as a training line)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from topo_attn.lm import retrieval
from topo_attn.lm.evaluate import passkey_scores
from topo_attn.lm.probe import Passkey

KEY = r"([a-z]+_[a-z]+)"
HEXV = r"([0-9a-f]+)"
NUM = r"([0-9]+)"

# (needle line, single question, multi-value question, separator of the multi-value answer) per key-value format
KV = {
    "assign": (KEY + ' = "' + HEXV + '"', KEY + ' = "', KEY + r' in \("', '", "'),
    "set": ("set " + KEY + " " + HEXV, "set " + KEY + " ", "get " + KEY + " ", " "),
    "call": (r'cfg\.put\("' + KEY + '", "' + HEXV + r'"\)', r'cfg\.put\("' + KEY + '", "',
             r'cfg\.get_all\("' + KEY + r'"\) == \["', '", "'),
    "yaml": (KEY + ": " + HEXV, KEY + ": ", KEY + r": \[", ", "),
    "json": ('"' + KEY + '": "' + HEXV + '",', '"' + KEY + '": "', '"' + KEY + r'": \["', '", "'),
    "toml": (KEY + " = '" + HEXV + "'", KEY + " = '", KEY + r" = \['", "', '"),
    "define": ("#define " + KEY + " 0x" + HEXV, "#define " + KEY + " 0x", KEY + r"_all = \[0x", ", 0x"),
    "env": ("export " + KEY + "=" + HEXV, "export " + KEY + "=", KEY + r"_list=\(", " "),
    "dict": (r'config\["' + KEY + r'"\]: ' + HEXV, r'config\["' + KEY + r'"\]: ',
             r'config\["' + KEY + r'"\]: \[', ", "),
    "arrow": ("# " + KEY + " -> " + HEXV, "# " + KEY + " -> ", "# " + KEY + " => ", " | "),
}
# (needle line with any indentation, question) per plain format
PLAIN = {
    "assign": (r"[ \t]*" + KEY + " = " + NUM, "assert " + KEY + " == "),
    "kwarg": (r"[ \t]*" + KEY + "=" + NUM + ",", r"check\(" + KEY + "="),
    "setattr": (r'[ \t]*setattr\(obj, "' + KEY + '", ' + NUM + r"\)", r'assert getattr\(obj, "' + KEY + r'"\) == '),
    "dict_item": (r'[ \t]*"' + KEY + '": ' + NUM + ",", r'assert table\["' + KEY + r'"\] == '),
    "checked": (r"[ \t]*" + KEY + r" = int\(" + NUM + r"\)", r"check_equal\(" + KEY + ", "),
    "attribute": (r"[ \t]*self\." + KEY + " = " + NUM, r"assert self\." + KEY + " == "),
    "annotated": (r"[ \t]*" + KEY + ": int = " + NUM, r"print\(" + KEY + r"\)  # "),
}
# (root line, link line, question) per chain format
CHAIN = {
    "python": (KEY + " = " + NUM, KEY + " = " + KEY, "assert " + KEY + " == "),
    "shell": (KEY + "=" + NUM, KEY + r"=\$" + KEY, r"test \$" + KEY + " -eq "),
    "c": ("int " + KEY + " = " + NUM + ";", "int " + KEY + " = " + KEY + ";", r"assert\(" + KEY + " == "),
    "lua": ("local " + KEY + " = " + NUM, "local " + KEY + " = " + KEY, r"print\(" + KEY + r"\) -- "),
    "perl": (r"my \$" + KEY + " = " + NUM + ";", r"my \$" + KEY + r" = \$" + KEY + ";", r"print \$" + KEY + "; # "),
    "js": ("let " + KEY + " = " + NUM + ";", "let " + KEY + " = " + KEY + ";", r"console\.assert\(" + KEY + " === "),
    "go": (KEY + " := " + NUM, KEY + " := " + KEY, r"fmt\.Println\(" + KEY + r"\)  // "),
}
FAMILY = {"single_needle": KV, "multi_key": KV, "multi_value": KV, "plain_needle": PLAIN, "variable_tracking": CHAIN}
CASES = [(task, fmt) for task in retrieval.TASKS for fmt in retrieval.FORMATS[task]]
LENGTH = 4096


# ------------------------------------------------------------------------------------------------ fillers


def real_filler() -> bytes:
    """Python source of the installed pytest and numpy packages (real code, unrelated to the probes)."""
    files = sorted(Path(np.__file__).parent.glob("*.py")) + sorted(Path(pytest.__file__).parent.glob("*.py"))
    return b"".join(p.read_bytes() for p in files)


def synthetic_filler(rng: np.random.Generator, lines: int = 3000) -> bytes:
    """Code-like lines, many in the probes' own syntaxes with random keys and values (look-alikes that the
    parsers must ignore because their keys differ), at indentations 0, 4 and 8."""
    def word() -> str:
        return "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), int(rng.integers(3, 9))))

    out = []
    for _ in range(lines):
        key, other, value = f"{word()}_{word()}", f"{word()}_{word()}", f"{rng.integers(16 ** 8):08x}"
        number = str(rng.integers(1000, 100000))
        line = rng.choice([f'{key} = "{value}"', f"set {key} {value}", f"# {key} -> {value}", f"{key} = {number}",
                           f"let {key} = {other};", f"{key}={number},", f"return {word()}({word()}, {number})",
                           f"self.{key} = {number}", f"{key} := {other}", "", f"def {word()}(self):"])
        out.append(" " * int(rng.choice([0, 4, 8])) + line if line else "")
    return ("\n".join(out) + "\n").encode()


@pytest.fixture(scope="module")
def fillers() -> dict[str, bytes]:
    return {"real": real_filler(), "synthetic": synthetic_filler(np.random.default_rng(2024))}


# ------------------------------------------------------------------------------------------------ reference


def lines_of(prompt: bytes) -> tuple[list[str], str]:
    """The prompt's whole lines and its last, open line (the question)."""
    text = prompt.decode("utf-8", errors="replace")
    *lines, question = text.split("\n")
    return lines, question


def reference_answer(task: str, fmt: str, prompt: bytes) -> bytes:
    """The answer read from the prompt's text alone: the question names a key (a variable); the lines of the
    format give its value(s)."""
    lines, question = lines_of(prompt)
    if task == "variable_tracking":
        root, link, ask = CHAIN[fmt]
        (name,) = re.fullmatch(ask, question).groups()
        assigned: dict[str, list[tuple[str, str]]] = {}
        for line in lines:
            if m := re.fullmatch(root, line):
                assigned.setdefault(m[1], []).append(("value", m[2]))
            elif m := re.fullmatch(link, line):
                assigned.setdefault(m[1], []).append(("name", m[2]))
        seen = set()
        while True:
            assert name not in seen
            seen.add(name)
            (kind, rhs), = assigned[name]  # each chain variable is assigned exactly once
            if kind == "value":
                return rhs.encode()
            name = rhs
    line_re, ask = (PLAIN[fmt] if task == "plain_needle" else KV[fmt][:2])
    if task == "multi_value":
        ask, sep = KV[fmt][2], KV[fmt][3]
    (key,) = re.fullmatch(ask, question).groups()
    values = [m[2] for line in lines if (m := re.fullmatch(line_re, line)) and m[1] == key]
    if task == "multi_value":
        assert len(values) >= 2
        return sep.join(values).encode()
    assert len(values) == 1
    return values[0].encode()


def parse_line(task: str, fmt: str, line: bytes) -> tuple[str, str]:
    """``(key, value)`` of an inserted line (for a chain link: ``(variable, source)``)."""
    text = line.decode().rstrip("\n")
    if task == "variable_tracking":
        m = re.fullmatch(CHAIN[fmt][0], text) or re.fullmatch(CHAIN[fmt][1], text)
    else:
        m = re.fullmatch((PLAIN[fmt] if task == "plain_needle" else KV[fmt])[0], text)
    assert m, (task, fmt, text)
    return m[1], m[2]


def occurrences(data: bytes, s: bytes) -> list[int]:
    return [m.start() for m in re.finditer(b"(?=" + re.escape(s) + b")", data)]


def inside(position: int, size: int, spans: np.ndarray) -> bool:
    return any(a <= position and position + size <= b for a, b in spans)


def options(task: str) -> dict:
    return dict(budget=8, block_size=64) if task == "single_needle" else {}


# ------------------------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("task, fmt", CASES)
@pytest.mark.parametrize("kind", ["real", "synthetic"])
def test_probe_is_determined_by_its_text_and_placed_as_asked(fillers, task, fmt, kind):
    filler = fillers[kind]
    rng = np.random.default_rng([len(task), len(fmt), ord(kind[0])])
    for _ in range(3):
        distance = int(rng.integers(600, 3300))
        probe = retrieval.TASKS[task](filler, distance, LENGTH, int(rng.integers(1 << 30)), fmt, **options(task))
        data = probe.ids.tobytes()
        assert isinstance(probe, Passkey) and probe.task == task and probe.format == fmt
        assert probe.ids.dtype == np.uint8 and probe.ids.shape == (LENGTH,) and probe.distance == distance
        assert probe.targets.dtype == np.int64 and np.array_equal(
            probe.targets, np.arange(probe.targets[0], probe.targets[0] + len(probe.targets)))
        assert data.endswith(b"\n") and probe.targets[-1] < LENGTH - 1 and b"\n" not in probe.answer
        assert probe.prompt == data[:probe.targets[0]] and probe.answer == data[probe.targets[0]:probe.targets[-1] + 1]

        # the answer is determined by the text
        assert reference_answer(task, fmt, probe.prompt) == probe.answer

        # the distance: from the needle's value to the answer
        keys_values = [parse_line(task, fmt, data[a:b]) for a, b in probe.needles]
        first_value = keys_values[0][1].encode()
        at = probe.targets[0] - distance
        assert data[at:at + len(first_value)] == first_value and inside(at, len(first_value), probe.needles[:1])
        assert probe.answer.startswith(first_value)

        # inserted lines are whole lines, in text order, disjoint
        spans = np.concatenate([probe.needles, probe.decoys])
        spans = spans[np.argsort(spans[:, 0])]
        assert (spans[1:, 0] >= spans[:-1, 1]).all()
        for a, b in spans:
            assert (a == 0 or data[a - 1] == ord("\n")) and data[b - 1] == ord("\n") and b"\n" not in data[a:b - 1]

        # the rest is one window of the filler, in order
        tail = data.rindex(b"\n", 0, probe.targets[0])
        kept, cursor = [], 0
        for a, b in spans:
            kept.append(data[cursor:a])
            cursor = b
        kept.append(data[cursor:tail])
        assert b"".join(kept) in filler

        check_decoys_and_leaks(task, fmt, probe, data, keys_values)


def check_decoys_and_leaks(task, fmt, probe, data, keys_values):
    question = lines_of(probe.prompt)[1]
    decoys = [parse_line(task, fmt, data[a:b]) for a, b in probe.decoys]
    if task == "variable_tracking":
        chain = {k for k, _ in keys_values}
        assert len(keys_values) == 5 and len(decoys) == 5  # default hops=4, decoy_chains=1
        assert all(k not in chain and v not in chain and v.encode() != probe.answer for k, v in decoys)
        for chain_lines in (keys_values, decoys):  # the links follow their chain, in order
            assert chain_lines[0][1].isdigit()
            for (a, _), (b, source) in zip(chain_lines, chain_lines[1:]):
                assert source == a
        asked = [keys_values[-1][0].encode()]
        values = [probe.answer]
    else:
        key = keys_values[0][0]
        assert all(k == key for k, _ in keys_values)
        assert len(decoys) == {"single_needle": 9, "plain_needle": 4, "multi_key": 15, "multi_value": 8}[task]
        answer_values = {v for _, v in keys_values}
        assert all(k != key and v not in answer_values for k, v in decoys)
        assert len({k for k, _ in decoys}) == len(decoys)
        asked, values = [key.encode()], [v.encode() for _, v in keys_values]
        if task == "multi_value":
            assert len(keys_values) == 4 and len(answer_values) == 4
    # no leak: each value occurs in its needle line and in the answer only; the asked name in the needles and
    # the question only
    answer_span = np.array([[probe.targets[0], probe.targets[-1] + 1]])
    for value in values:
        found = occurrences(data, value)
        assert all(inside(p, len(value), probe.needles) or inside(p, len(value), answer_span) for p in found)
        assert len(found) == sum(value in data[a:b] for a, b in probe.needles) + (value in probe.answer)
    for name in asked:
        found = occurrences(data, name)
        assert len(found) == sum(data[a:b].count(name) for a, b in probe.needles) + 1
        assert name.decode() in question
    if task == "single_needle":  # more decoy blocks than the budget, none shared with the needle or each other
        blocks = [set(range(a // 64, (b - 1) // 64 + 1)) for a, b in np.concatenate([probe.needles, probe.decoys])]
        assert sum(map(len, blocks)) == len(set().union(*blocks)) and len(blocks) - 1 > 8
    if task == "plain_needle":  # the needle has the indentation of the code line it was put before
        a, b = probe.needles[0]
        after = data[b:data.index(b"\n", b)]
        if b not in probe.decoys[:, 0] and b != data.rindex(b"\n", 0, probe.targets[0]):
            indent = len(data[a:b]) - len(data[a:b].lstrip(b" \t"))
            assert len(after) - len(after.lstrip(b" \t")) == indent


@pytest.mark.parametrize("task", list(retrieval.TASKS))
def test_training_and_held_out_formats_are_disjoint(fillers, task):
    training, held_out = retrieval.training_formats(task), retrieval.held_out_formats(task)
    assert len(training) >= 2 and len(held_out) >= 2 and not set(training) & set(held_out)
    assert set(training) | set(held_out) == set(retrieval.FORMATS[task])
    assert all(not retrieval.FORMATS[task][f].held_out for f in training)
    # no held-out needle parses as a line of any training format of any task, and the reverse
    rng = np.random.default_rng(len(task))
    all_training = [(t, f) for t in retrieval.TASKS for f in retrieval.training_formats(t)]
    for fmt in held_out + training:
        probe = retrieval.TASKS[task](fillers["real"], 1500, LENGTH, int(rng.integers(1 << 30)), fmt, **options(task))
        others = all_training if fmt in held_out else [(task, f) for f in held_out]
        for a, b in probe.needles:
            line = probe.ids[a:b].tobytes().decode().rstrip("\n")
            for t, f in others:
                family = FAMILY[t][f]
                patterns = family[:2] if t == "variable_tracking" else family[:1]
                assert not any(re.fullmatch(p, line) for p in patterns), (fmt, t, f, line)


@pytest.mark.parametrize("task", list(retrieval.TASKS))
def test_seeded(fillers, task):
    make = retrieval.TASKS[task]
    a = make(fillers["real"], 1000, 2048, 7, **options(task))
    b = make(fillers["real"], 1000, 2048, np.random.default_rng(7), **options(task))
    c = make(fillers["real"], 1000, 2048, 8, **options(task))
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.needles, b.needles)
    assert not np.array_equal(a.ids, c.ids)
    assert a.format == retrieval.training_formats(task)[0]


def test_single_needle_decoys_fill_more_blocks_than_the_budget(fillers):
    rng = np.random.default_rng(3)
    for budget, block in ((4, 32), (12, 64), (30, 64)):
        probe = retrieval.single_needle(fillers["synthetic"], int(rng.integers(2000, 6000)), 8192,
                                        int(rng.integers(1 << 30)), "dict", budget=budget, block_size=block)
        starts = np.sort(np.concatenate([probe.needles[:, 0], probe.decoys[:, 0]]))
        blocks = {b for a, e in probe.decoys for b in range(a // block, (e - 1) // block + 1)}
        assert len(probe.decoys) == budget + 1 and len(blocks) > budget
        assert not blocks & set(range(probe.needles[0, 0] // block, (probe.needles[0, 1] - 1) // block + 1))
        assert (np.diff(starts) > block).all()
        assert (probe.decoys[:, 0] < probe.needles[0, 0]).any() and (probe.decoys[:, 0] > probe.needles[0, 0]).any()


def test_multi_value_and_chain_options(fillers):
    rng = np.random.default_rng(4)
    probe = retrieval.multi_value(fillers["real"], 2500, LENGTH, 1, "arrow", values=6, decoys=3)
    assert len(probe.needles) == 6 and len(probe.decoys) == 3 and probe.answer.count(b" | ") == 5
    assert (probe.needles[1:, 0] > probe.needles[0, 0]).all()
    probe = retrieval.variable_tracking(fillers["synthetic"], 3000, LENGTH, int(rng.integers(99)), "go", hops=7,
                                        decoy_chains=3)
    assert len(probe.needles) == 8 and len(probe.decoys) == 24
    assert reference_answer("variable_tracking", "go", probe.prompt) == probe.answer


def test_probe_set(fillers):
    docs = np.stack([np.frombuffer(fillers["real"][i * 3000:i * 3000 + 2048], np.uint8) for i in range(5)])
    formats = retrieval.held_out_formats("multi_key")
    probes = retrieval.probe_set("multi_key", docs, [300, 900, 1500], 4, formats, seed=3, keys=6)
    assert len(probes) == 12 and [p.distance for p in probes] == [300] * 4 + [900] * 4 + [1500] * 4
    assert [p.format for p in probes[:4]] == [formats[i % len(formats)] for i in range(4)]
    assert all(len(p.ids) == 2048 and reference_answer("multi_key", p.format, p.prompt) == p.answer for p in probes)
    again = retrieval.probe_set("multi_key", docs, [900], 4, formats, seed=3, keys=6)
    assert all(np.array_equal(a.ids, b.ids) for a, b in zip(again, probes[4:8]))  # one distance: same probes
    count = len(retrieval.training_formats("plain_needle"))  # one probe per training format
    default = retrieval.probe_set("plain_needle", fillers["real"], [700], count, seed=1, length=LENGTH)
    assert {p.format for p in default} == set(retrieval.training_formats("plain_needle"))


def test_probes_score_as_passkeys():
    """evaluate.passkey_scores reads a probe as a passkey: a stand-in model that knows every next byte gets
    each answer exactly; one that always predicts byte 0 gets none."""
    class Oracle(torch.nn.Module):
        def __init__(self, right: bool):
            super().__init__()
            self.w, self.right = torch.nn.Parameter(torch.zeros(1)), right

        def forward(self, ids):
            nxt = torch.roll(ids, -1, dims=1) if self.right else torch.zeros_like(ids)
            return type("Out", (), {"logits": torch.nn.functional.one_hot(nxt, 256).float()})()

    filler = synthetic_filler(np.random.default_rng(8), 400)
    probes = [retrieval.TASKS[t](filler, 900, 2048, s, **options(t)) for s, t in enumerate(retrieval.TASKS)]
    assert all(r["exact"] for r in passkey_scores(Oracle(True), probes))
    assert not any(r["exact"] for r in passkey_scores(Oracle(False), probes))


def test_scores_split_finding_a_value_from_copying_it():
    """A probe's lookups are the first byte of each value of its answer (each of multi_value's values); a
    stand-in model that knows every next byte except where a word starts finds none of them and copies every
    other byte, so no answer is exact; the counts add up to the answer."""
    class CopiesOnly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, ids):
            word = torch.tensor([chr(c).isalnum() or c == ord("_") for c in range(256)])[ids]
            start = torch.roll(word, -1, dims=1) & ~word  # the next byte starts a word: predict byte 0 there
            nxt = torch.where(start, torch.zeros_like(ids), torch.roll(ids, -1, dims=1))
            return type("Out", (), {"logits": torch.nn.functional.one_hot(nxt, 256).float()})()

    filler = synthetic_filler(np.random.default_rng(9), 400)
    probes = [retrieval.TASKS[t](filler, 900, 2048, s, **options(t)) for s, t in enumerate(retrieval.TASKS)]
    for probe in probes:
        values = probe.answer.replace(b",", b" ").replace(b'"', b" ").split()
        assert len(probe.lookups) == len(values), (probe.task, probe.answer)
        assert all(probe.answer[i:].startswith(v) for i, v in zip(probe.lookups, values))
    counts = [len(p.lookups) for p in probes]
    assert counts[list(retrieval.TASKS).index("multi_value")] == options("multi_value").get("values", 4)
    for probe, row in zip(probes, passkey_scores(CopiesOnly(), probes)):
        assert not row["exact"] and row["lookups_right"] == 0 and row["lookups"] == len(probe.lookups)
        assert row["copies_right"] == row["copies"] == len(probe.answer) - len(probe.lookups)


@pytest.mark.parametrize("call, error, name", [
    (lambda f: retrieval.multi_key(f, 4096, 4096, 0), ValueError, "distance"),
    (lambda f: retrieval.multi_key(f, 4085, 4096, 0), ValueError, "distance"),
    (lambda f: retrieval.multi_value(f, 40, 4096, 0), ValueError, "distance"),
    (lambda f: retrieval.multi_key(f, 0, 4096, 0), ValueError, "distance"),
    (lambda f: retrieval.multi_key(f, 100.0, 4096, 0), TypeError, "distance"),
    (lambda f: retrieval.multi_key(f, 100, 4096, 0, "xml"), ValueError, "format"),
    (lambda f: retrieval.plain_needle(f, 100, 4096, 0, "set"), ValueError, "format"),
    (lambda f: retrieval.multi_key(f, 100, 4096, 0, 3), TypeError, "format"),
    (lambda f: retrieval.multi_key(f[:1000], 500, 4096, 0), retrieval.FillerError, "filler"),
    (lambda f: retrieval.multi_key(b"x" * 8000, 500, 4096, 0), retrieval.FillerError, "filler"),
    (lambda f: retrieval.multi_key("text", 500, 4096, 0), TypeError, "filler"),
    (lambda f: retrieval.multi_key(np.zeros(8000, np.int32), 500, 4096, 0), TypeError, "filler"),
    (lambda f: retrieval.multi_key(f, 500, 4096, "seed"), TypeError, "seed"),
    (lambda f: retrieval.single_needle(f, 500, 4096, 0, budget=8, decoys=8), ValueError, "decoys"),
    (lambda f: retrieval.single_needle(f, 500, 1024, 0, budget=20, block_size=64), ValueError, "length"),
    (lambda f: retrieval.variable_tracking(f, 500, 4096, 0, hops=0), ValueError, "hops"),
    (lambda f: retrieval.probe_set("ruler", f, [100], 1, length=1024), ValueError, "task"),
    (lambda f: retrieval.probe_set("multi_key", f, [], 1, length=1024), ValueError, "distances"),
    (lambda f: retrieval.probe_set("multi_key", f, [100], 1, ["nope"], length=1024), ValueError, "format"),
    (lambda f: retrieval.probe_set("multi_key", f, [100], 1), ValueError, "length"),
])
def test_errors_name_the_argument(fillers, call, error, name):
    with pytest.raises(error, match=name):
        call(fillers["real"])


def test_no_leak_when_the_filler_is_full_of_look_alike_names():
    """Filler of assignments to the very names plain_needle draws its keys from (a fifth of all of them in
    every few kilobytes): the probe must still hold its key only in its own line and the question, and the
    answer only in the needle."""
    rng = np.random.default_rng(31)
    words = retrieval.CODE_WORDS
    names = [f"{a}_{b}" for a in words for b in words if a != b]
    lines = [f"    {names[i]} = {rng.integers(1000, 100000)}" for i in rng.integers(0, len(names), 20000)]
    filler = ("\n".join(lines) + "\n").encode()
    for seed in range(6):
        fmt = retrieval.training_formats("plain_needle")[seed % 2]
        probe = retrieval.plain_needle(filler, int(rng.integers(500, 3000)), LENGTH, seed, fmt)
        data = probe.ids.tobytes()
        assert reference_answer("plain_needle", fmt, probe.prompt) == probe.answer
        key = parse_line("plain_needle", fmt, data[slice(*probe.needles[0])])[0].encode()
        assert len(occurrences(data, key)) == 2 and len(occurrences(data, probe.answer)) == 2
