"""Issue 41 (1): validation deduplicated against training (by content and by normalised path), packing in a seeded
order of file contents, the one-window-per-file evaluation set and its diversity rules, its manifest, and
``python -m topo_attn.lm corpus`` (``--out``, ``--check``, bad command lines). Every tree is synthetic, made in
``tmp_path``; no test reads this machine's site-packages."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from topo_attn import cli
from topo_attn.lm import corpus
from topo_attn.lm.__main__ import main as lm_main

ROOT = Path(__file__).resolve().parents[2]
LM_PROG = "python -m topo_attn.lm"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def module_text(tag: str, lines: int = 6) -> str:
    """A file's text, unique to ``tag`` (``lines`` lines of about 30 bytes)."""
    return "".join(f"value_{i} = {tag!r}  # {hashlib.sha256(f'{tag}{i}'.encode()).hexdigest()[:8]}\n"
                   for i in range(lines))


def first_index(predicate, start: int = 0) -> int:
    """The first ``i >= start`` with ``predicate(i)`` (the names below are chosen for the side they land on)."""
    i = start
    while not predicate(i):
        i += 1
    return i


def run_lm(argv: list[str], capsys) -> tuple[int, str, str]:
    """``python -m topo_attn.lm *argv`` in this process, through cli.run as the module runs it."""
    capsys.readouterr()
    try:
        code = cli.run(lm_main, argv, prog=LM_PROG)
    except SystemExit as done:  # argparse's own errors
        code = done.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def check_one_line_error(code: int, err: str, *texts: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{LM_PROG}: error: "), err
    for text in texts:
        assert text in err, err


# ------------------------------------------------------------------------------------------ normalised paths
@pytest.mark.parametrize("name, expected", [
    ("site-packages/rich/console.py", "rich/console.py"),
    ("site-packages/pip/_vendor/rich/console.py", "rich/console.py"),
    ("site-packages/pip/_vendor/rich/_vendor/x/y.py", "x/y.py"),  # the last vendoring folder
    ("site-packages/build/lib/botorch/models/ensemble.py", "botorch/models/ensemble.py"),
    ("site-packages/build/lib.linux-x86_64-cpython-311/botorch/a.py", "botorch/a.py"),
    ("site-packages/sklearn/externals/array_api_compat/common/_linalg.py", "array_api_compat/common/_linalg.py"),
    ("site-packages/scipy/_external/array_api_compat/__init__.py", "array_api_compat/__init__.py"),
    ("site-packages/debugpy/_vendored/pydevd/pydevd.py", "pydevd/pydevd.py"),
    ("site-packages/jax/_src/third_party/scipy/linalg.py", "scipy/linalg.py"),
    ("site-packages/setuptools/extern/__init__.py", "__init__.py"),
    ("stdlib/json/decoder.py", "json/decoder.py"),
    ("stdlib/site-packages/rich/console.py", "rich/console.py"),
    ("site-packages/foo/dist-packages/rich/console.py", "rich/console.py"),
    # not markers: a part of a name, a file called like a folder, a build folder without lib, lib alone
    ("site-packages/vendorize/x.py", "vendorize/x.py"),
    ("site-packages/pkg/_vendor.py", "pkg/_vendor.py"),
    ("site-packages/pkg/vendor_tools/x.py", "pkg/vendor_tools/x.py"),
    ("site-packages/build/x.py", "build/x.py"),
    ("site-packages/build/lib.py", "build/lib.py"),
    ("site-packages/numpy/lib/_npyio.py", "numpy/lib/_npyio.py"),
    ("site-packages/pip/_vendor.py", "pip/_vendor.py"),
    ("x.py", "x.py"),
])
def test_normalized_path(name, expected):
    assert corpus.normalized_path(name) == expected


@pytest.mark.parametrize("name, package", [
    ("stdlib/json/decoder.py", "stdlib"),
    ("stdlib/test/test_json/__init__.py", "stdlib"),
    ("stdlib/site-packages/rich/console.py", "rich"),  # another environment's packages are not the stdlib
    ("site-packages/six.py", "six"),
    ("site-packages/pip/_vendor/rich/console.py", "pip"),  # the package that installed it
    ("site-packages/sympy/external/tests/test_codegen.py", "sympy"),
    ("site-packages/build/lib/botorch/models/ensemble.py", "botorch"),
])
def test_package_of(name, package):
    assert corpus.package_of(name) == package


# ------------------------------------------------------------------------------------------ deduplication
def validation_name(template: str, percent: int, side: bool, start: int = 0) -> tuple[int, str]:
    i = first_index(lambda k: corpus.is_validation(template.format(k), percent) == side, start)
    return i, template.format(i)


def test_a_vendored_copy_in_training_keeps_its_original_out_of_validation(tmp_path):
    percent = 30
    # a module of rich in validation whose vendored copy in pip (other bytes) is a training file
    i = first_index(lambda k: corpus.is_validation(f"site-packages/rich/m{k}.py", percent)
                    and not corpus.is_validation(f"site-packages/pip/_vendor/rich/m{k}.py", percent))
    # another module of rich in validation with no copy anywhere
    j = first_index(lambda k: corpus.is_validation(f"site-packages/rich/m{k}.py", percent), i + 1)
    # a built copy in validation (build/lib) of a training file
    b = first_index(lambda k: corpus.is_validation(f"site-packages/build/lib/botorch/b{k}.py", percent)
                    and not corpus.is_validation(f"site-packages/botorch/b{k}.py", percent))
    site = tmp_path / "site"
    write(site / f"rich/m{i}.py", module_text("rich, newer"))
    write(site / f"pip/_vendor/rich/m{i}.py", module_text("rich, vendored"))
    write(site / f"rich/m{j}.py", module_text("alone"))
    write(site / f"build/lib/botorch/b{b}.py", module_text("built"))
    write(site / f"botorch/b{b}.py", module_text("installed"))
    split = corpus.split_corpus(corpus.find_sources([("site-packages", site)]), percent)
    validation = {f.name for f in split.validation}
    duplicates = {d.file.name: (d.reason, d.of) for d in split.duplicates}
    assert duplicates == {f"site-packages/rich/m{i}.py": ("path", f"site-packages/pip/_vendor/rich/m{i}.py"),
                          f"site-packages/build/lib/botorch/b{b}.py": ("path", f"site-packages/botorch/b{b}.py")}
    assert validation == {f"site-packages/rich/m{j}.py"}  # the one without a copy stays
    assert f"site-packages/pip/_vendor/rich/m{i}.py" in {f.name for f in split.train}  # training is untouched
    # without the training copy, the original is a validation file again
    (site / f"pip/_vendor/rich/m{i}.py").unlink()
    again = corpus.split_corpus(corpus.find_sources([("site-packages", site)]), percent)
    assert f"site-packages/rich/m{i}.py" in {f.name for f in again.validation}


def test_a_byte_identical_copy_in_training_keeps_a_file_out_of_validation(tmp_path):
    percent = 30
    i, held = validation_name("site-packages/alpha/a{}.py", percent, True)
    _, trained = validation_name("site-packages/beta/b{}.py", percent, False)
    k, other = validation_name("site-packages/alpha/a{}.py", percent, True, i + 1)
    site = tmp_path / "site"
    write(site / held.removeprefix("site-packages/"), module_text("shared"))
    write(site / trained.removeprefix("site-packages/"), module_text("shared"))
    write(site / other.removeprefix("site-packages/"), module_text("shared, edited"))
    split = corpus.split_corpus(corpus.find_sources([("site-packages", site)]), percent)
    assert [(d.file.name, d.reason, d.of) for d in split.duplicates] == [(held, "content", trained)]
    assert [f.name for f in split.validation] == [other]
    assert [f.name for f in split.train] == [trained]


def test_copies_within_validation_keep_the_first_and_the_rule_holds_on_a_tree_full_of_copies(tmp_path):
    percent = 40
    rng = np.random.default_rng(0)
    site = tmp_path / "site"
    originals = [module_text(f"m{m}") for m in range(30)]
    for p in range(12):  # 12 packages, each with copies of some of 30 modules under vendored or built paths
        for m in rng.choice(30, 8, replace=False):
            prefix = ["", "_vendor/lib/", "build/lib/"][int(rng.integers(3))]
            write(site / f"pkg{p}/{prefix}mod{m}.py",
                  originals[m] if rng.random() < 0.5 else module_text(f"p{p}m{m}"))
    files = corpus.find_sources([("site-packages", site)])
    split = corpus.split_corpus(files, percent)
    assert split.duplicates and split.validation
    train_hashes = {f.sha256 for f in split.train}
    train_paths = {corpus.normalized_path(f.name) for f in split.train}
    for f in split.validation:
        assert f.sha256 not in train_hashes and corpus.normalized_path(f.name) not in train_paths
    # within validation, no two files share bytes or a normalised path
    assert len({f.sha256 for f in split.validation}) == len(split.validation)
    assert len({corpus.normalized_path(f.name) for f in split.validation}) == len(split.validation)
    # every file is on exactly one side or a duplicate; the validation ones kept are the first in name order
    assert sorted([f.name for f in split.train] + [f.name for f in split.validation]
                  + [d.file.name for d in split.duplicates]) == [f.name for f in files]
    kept = {f.name for f in split.validation}
    for d in split.duplicates:
        assert d.of in kept | {f.name for f in split.train}
        if d.of in kept:
            assert d.of < d.file.name


def test_the_stdlib_root_leaves_out_another_environments_site_packages(tmp_path):
    lib = tmp_path / "lib"
    write(lib / "json/decoder.py", module_text("stdlib"))
    write(lib / "site-packages/rich/console.py", module_text("rich"))
    write(lib / "dist-packages/six.py", module_text("six"))
    assert [f.name for f in corpus.find_sources([("stdlib", lib)])] == ["stdlib/json/decoder.py"]
    # listed as a root of its own, it counts there
    names = [f.name for f in corpus.find_sources([("stdlib", lib), ("site-packages", lib / "site-packages")])]
    assert names == ["site-packages/rich/console.py", "stdlib/json/decoder.py"]


def test_manifest_records_duplicates(tmp_path):
    percent = 30
    i, held = validation_name("site-packages/alpha/a{}.py", percent, True)
    _, trained = validation_name("site-packages/beta/b{}.py", percent, False)
    site = tmp_path / "site"
    for name in (held, trained):
        write(site / name.removeprefix("site-packages/"), module_text("shared"))
    split = corpus.split_corpus(corpus.find_sources([("site-packages", site)]), percent)
    record = corpus.manifest(split.train, split.validation, split.duplicates)
    assert record["duplicate_files"] == 1 and record["validation_files"] == 0 and record["train_files"] == 1
    (entry,) = [f for f in record["files"] if f["side"] == "duplicate"]
    assert entry["name"] == held and entry["reason"] == "content" and entry["duplicate_of"] == trained


# ------------------------------------------------------------------------------------------ packing
def test_adding_a_file_leaves_every_other_files_order_unchanged(tmp_path):
    root = tmp_path / "lib"
    for i in range(60):
        write(root / f"pkg{i % 6}/mod{i}.py", module_text(f"m{i}", 2))
    files = corpus.find_sources([("stdlib", root)])
    order = [f.name for f in corpus.packing_order(files, seed=0)]
    assert sorted(order) == [f.name for f in files] and order != [f.name for f in files]
    for new in ("aaa/first.py", "pkg3/mod_new.py", "zzz/last.py"):  # wherever its name sorts
        write(root / new, module_text(new, 3))
        more = corpus.find_sources([("stdlib", root)])
        again = [f.name for f in corpus.packing_order(more, seed=0)]
        assert [n for n in again if n != f"stdlib/{new}"] == order
        (root / new).unlink()
    # the order depends on the contents, not on where the files are listed or on their names
    shuffled = list(files)
    np.random.default_rng(1).shuffle(shuffled)
    assert [f.name for f in corpus.packing_order(shuffled, seed=0)] == order
    keys = [corpus.seeded_key(f.sha256, 0) for f in corpus.packing_order(files, seed=0)]
    assert keys == sorted(keys)
    digest = hashlib.sha256(f"pack:0:{files[0].sha256}".encode()).digest()
    assert corpus.seeded_key(files[0].sha256, 0) == int.from_bytes(digest[:8], "little")
    # another seed, another order; the stream follows the order
    assert [f.name for f in corpus.packing_order(files, seed=1)] != order
    stream = corpus.pack(files, seed=0)
    by_name = {f.name: f for f in files}
    assert stream.tobytes() == b"".join(by_name[n].path.read_bytes() + corpus.SEPARATOR for n in order)


def test_files_of_equal_bytes_pack_in_name_order(tmp_path):
    root = tmp_path / "lib"
    for name in ("b.py", "a.py", "c.py"):
        write(root / name, "x = 1\n")
    files = corpus.find_sources([("stdlib", root)])
    assert [f.name for f in corpus.packing_order(files[::-1], seed=5)] == ["stdlib/a.py", "stdlib/b.py",
                                                                          "stdlib/c.py"]


# ------------------------------------------------------------------------------------------ the evaluation set
LENGTH = 64


def write_diverse_tree(base: Path, site_packages: int = 26, per_package: int = 12, stdlib_files: int = 40,
                       short: bool = True) -> list[tuple[str, Path]]:
    """A stdlib root and a site-packages root of ``site_packages`` packages, each file about 180 bytes (three
    windows of LENGTH), some too short for a window; also a vendored and a built copy of training files."""
    lib, site = base / "lib", base / "site"
    for i in range(stdlib_files):
        write(lib / f"std{i % 5}/m{i}.py", module_text(f"std{i}"))
    for p in range(site_packages):
        for i in range(per_package):
            write(site / f"pkg{p:02d}/sub/m{i}.py", module_text(f"p{p}m{i}"))
        if short:
            write(site / f"pkg{p:02d}/tiny.py", "x = 1\n")
        write(site / f"pkg{p:02d}/_vendor/pkg{(p + 1) % site_packages:02d}/sub/m0.py", module_text(f"v{p}"))
        write(site / f"build/lib/pkg{p:02d}/sub/m1.py", module_text(f"p{p}m1"))  # a byte copy too
    return [("stdlib", lib), ("site-packages", site)]


@pytest.fixture(scope="module")
def diverse(tmp_path_factory):
    roots = write_diverse_tree(tmp_path_factory.mktemp("diverse"))
    return roots, corpus.find_sources(roots)


def test_the_eval_set_is_one_window_per_deduplicated_validation_file_of_many_packages(diverse):
    _, files = diverse
    ev = corpus.build_eval_set(files, length=LENGTH, seed=0, percent=50)
    assert ev.documents.dtype == np.uint8 and ev.documents.shape == (corpus.EVAL_FILES, LENGTH)
    names = [f.name for f in ev.files]
    assert len(set(names)) == corpus.EVAL_FILES  # one window per file
    validation = {f.name for f in ev.split.validation}
    assert set(names) <= validation
    train_hashes = {f.sha256 for f in ev.split.train}
    train_paths = {corpus.normalized_path(f.name) for f in ev.split.train}
    for f, offset, doc, package in zip(ev.files, ev.offsets, ev.documents, ev.packages):
        data = f.path.read_bytes()
        assert f.size >= LENGTH and 0 <= offset <= len(data) - LENGTH
        assert doc.tobytes() == data[offset:offset + LENGTH]
        assert offset == corpus.seeded_key(f.sha256, 0, "window") % (len(data) - LENGTH + 1)
        assert f.sha256 not in train_hashes and corpus.normalized_path(f.name) not in train_paths
        assert package == corpus.package_of(f.name)
    assert ev.split.duplicates  # the tree's vendored and built copies were found
    packages = set(ev.packages)
    assert corpus.STDLIB in packages and len(packages - {corpus.STDLIB}) >= corpus.MIN_PACKAGES
    # a package at a time: the first documents come from distinct packages, as many as there are
    eligible = {corpus.package_of(f.name) for f in ev.split.validation if f.size >= LENGTH}
    assert len(set(ev.packages[:len(eligible)])) == len(eligible)
    summary = ev.summary()
    assert summary["documents"] == corpus.EVAL_FILES and summary["packages"] == len(packages) - 1
    assert summary["duplicates"] == len(ev.split.duplicates) == \
        summary["duplicates_by_content"] + summary["duplicates_by_path"]
    # seeded: the same set again, another with another seed
    again = corpus.build_eval_set(files, length=LENGTH, seed=0, percent=50)
    assert np.array_equal(again.documents, ev.documents) and [f.name for f in again.files] == names
    other = corpus.build_eval_set(files, length=LENGTH, seed=1, percent=50)
    assert [f.name for f in other.files] != names


def test_the_eval_set_rules_raise_clear_errors(tmp_path, diverse):
    _, files = diverse
    # too few files: all 128 cannot be filled
    with pytest.raises(ValueError, match=r"needs 128 validation files of >= 64 bytes: this corpus has \d+"):
        corpus.build_eval_set(files, length=LENGTH, percent=10)
    # enough files, too few packages
    few = write_diverse_tree(tmp_path / "few", site_packages=8, per_package=40)
    with pytest.raises(ValueError, match="at least 20 packages and the standard library: .* in 8 packages"):
        corpus.build_eval_set(corpus.find_sources(few), length=LENGTH, percent=50)
    # enough packages, no standard library
    no_std = write_diverse_tree(tmp_path / "nostd", stdlib_files=0)
    with pytest.raises(ValueError, match="and the standard library: .* \\(0 standard-library files"):
        corpus.build_eval_set(corpus.find_sources(no_std), length=LENGTH, percent=50)
    # windows longer than every file
    with pytest.raises(ValueError, match="needs 128 validation files of >= 4096 bytes: this corpus has 0"):
        corpus.build_eval_set(files, length=4096, percent=50)
    with pytest.raises(ValueError, match="count must be >= min_packages \\+ 1 = 21"):
        corpus.build_eval_set(files, length=LENGTH, count=20, percent=50)
    # fewer documents than packages: the standard library takes the last place when the rounds leave it out
    for seed in range(6):
        small = corpus.build_eval_set(files, length=LENGTH, count=4, min_packages=3, seed=seed, percent=50)
        assert corpus.STDLIB in small.packages and len(set(small.packages)) == 4
        rounds = sorted({corpus.package_of(f.name) for f in small.split.validation if f.size >= LENGTH},
                        key=lambda p: (corpus.seeded_key(p, seed, "package"), p))[:4]
        assert small.packages == (rounds if corpus.STDLIB in rounds else rounds[:3] + [corpus.STDLIB])
    # smaller rules pass on the small tree
    assert len(corpus.build_eval_set(corpus.find_sources(few), length=LENGTH, count=30, min_packages=8,
                                     percent=50).files) == 30


def test_manifests_round_trip(tmp_path, diverse):
    _, files = diverse
    ev = corpus.build_eval_set(files, length=LENGTH, percent=50)
    npz, record = corpus.save_eval_set(ev, tmp_path / "set")
    assert (npz.name, record.name) == ("eval_set.npz", "eval_set.json")
    with np.load(npz, allow_pickle=False) as data:
        assert np.array_equal(data["documents"], ev.documents)
        assert list(data["names"]) == [f.name for f in ev.files]
        assert list(data["offsets"]) == ev.offsets
    expected = [dict(name=f.name, sha256=f.sha256) for f in ev.files]
    assert corpus.read_manifest(npz) == expected
    assert [dict(name=e["name"], sha256=e["sha256"]) for e in corpus.read_manifest(record)] == expected
    saved = json.loads(record.read_text())
    assert saved["documents"] == corpus.EVAL_FILES and saved["seed"] == 0
    assert [(f["package"], f["offset"]) for f in saved["files"]] == list(zip(ev.packages, ev.offsets))
    assert len(saved["duplicate_files"]) == len(ev.split.duplicates)
    # a corpus manifest, gzipped as train writes it: names, hashes and sides
    split = ev.split
    path = tmp_path / "corpus_manifest.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(corpus.manifest(split.train, split.validation, split.duplicates), f)
    entries = corpus.read_manifest(path)
    assert len(entries) == len(files)
    assert {e["name"]: e["side"] for e in entries if e["side"] == "validation"} == \
        {f.name: "validation" for f in split.validation}
    # what is not a manifest
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="is not a manifest"):
        corpus.read_manifest(tmp_path / "notes.txt")
    np.savez(tmp_path / "docs.npz", documents=ev.documents)
    with pytest.raises(ValueError, match="no 'names' and 'sha256'"):
        corpus.read_manifest(tmp_path / "docs.npz")
    with pytest.raises(FileNotFoundError):
        corpus.read_manifest(tmp_path / "nothing.json")


# ------------------------------------------------------------------------------------------ the command
def root_args(roots) -> list[str]:
    return [a for kind, path in roots for a in ("--root", f"{kind}={path}")]


def test_corpus_out_writes_the_set(tmp_path, capsys):
    roots = write_diverse_tree(tmp_path / "tree")
    code, out, err = run_lm(["corpus", "--out", str(tmp_path / "set"), *root_args(roots), "--length", str(LENGTH),
                             "--validation-percent", "50", "--json"], capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["documents"] == 128 and summary["packages"] >= 20 and summary["stdlib_files"] >= 1
    assert summary["duplicates"] >= 1
    with np.load(tmp_path / "set" / "eval_set.npz") as data:
        assert data["documents"].shape == (128, LENGTH)
    assert json.loads((tmp_path / "set" / "eval_set.json").read_text())["documents"] == 128


def test_corpus_check_reports_present_changed_and_missing_files(tmp_path, capsys):
    root = tmp_path / "lib"
    for i in range(10):
        write(root / f"pkg/m{i}.py", module_text(f"m{i}"))
    roots = [("stdlib", root)]
    train, validation = corpus.split_sources(corpus.find_sources(roots), 30)
    path = tmp_path / "manifest.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(corpus.manifest(train, validation), f)
    args = ["corpus", "--check", str(path), *root_args(roots)]
    code, out, err = run_lm(args, capsys)
    assert code == 0, err
    assert "manifest" in out and "same content: 10\nchanged: 0\nmissing: 0\nhere but not listed: 0" in out
    # one file edited, one removed, one added
    write(root / "pkg/m3.py", module_text("edited"))
    (root / "pkg/m7.py").unlink()
    write(root / "pkg/new.py", module_text("new"))
    code, out, err = run_lm(args, capsys)
    assert code == 0, err
    assert "same content: 8\nchanged: 1\nmissing: 1\nhere but not listed: 1" in out
    assert "changed: stdlib/pkg/m3.py" in out and "missing: stdlib/pkg/m7.py" in out
    sides = {f.name: ("validation" if f in validation else "train") for f in train + validation}
    line = [x for x in out.splitlines() if x.strip().startswith(sides["stdlib/pkg/m3.py"] + ":")]
    assert line and "changed 1" in line[0]
    code, out, _ = run_lm([*args, "--json"], capsys)
    result = json.loads(out)
    assert (result["changed"], result["missing"], result["extra"], len(result["same"])) == \
        (["stdlib/pkg/m3.py"], ["stdlib/pkg/m7.py"], 1, 8)
    assert sum(sum(c.values()) for c in result["sides"].values()) == 10


@pytest.mark.parametrize("args, texts", [
    (["--out", "{tmp}/set", "--files", "0"], ["--files", ">= 1, got 0"]),
    (["--out", "{tmp}/set", "--files", "5", "--min-packages", "10"], ["--files", "--min-packages + 1 = 11"]),
    (["--out", "{tmp}/set", "--length", "-3"], ["--length", ">= 1"]),
    (["--out", "{tmp}/set", "--validation-percent", "0"], ["--validation-percent", "1 to 99"]),
    (["--out", "{tmp}/set", "--root", "lib={tmp}"], ["--root", "KIND=PATH", "'lib="]),
    (["--out", "{tmp}/set", "--root", "stdlib={tmp}/nothing"], ["--root", "no folder"]),
    (["--out", "{tmp}/file.txt", "--root", "stdlib={tmp}/lib"], ["--out", "is a file"]),
    (["--check", "{tmp}/nothing.json"], ["--check", "no file", "nothing.json"]),
    (["--check", "{tmp}/file.txt"], ["--check", "is not a manifest"]),
    # a machine with too few files: the builder's own message, still one line
    (["--out", "{tmp}/set", "--root", "stdlib={tmp}/lib"], ["needs 128 validation files", "this corpus has"]),
])
def test_a_bad_command_line_is_one_line_and_exit_2(tmp_path, capsys, args, texts):
    write(tmp_path / "lib/m.py", module_text("m"))
    (tmp_path / "file.txt").write_text("not a manifest")
    code, out, err = run_lm(["corpus", *[a.format(tmp=tmp_path) for a in args]], capsys)
    check_one_line_error(code, err, *texts)
    assert out == "" and not (tmp_path / "set").exists()


def test_corpus_needs_out_or_check(capsys):
    code, _, err = run_lm(["corpus"], capsys)
    assert code == 2 and "one of the arguments --out --check is required" in err and "Traceback" not in err
    code, _, err = run_lm(["corpus", "--out", "x", "--check", "y"], capsys)
    assert code == 2 and "not allowed with argument" in err


def test_the_module_runs_the_subcommand(tmp_path):
    """``python -m topo_attn.lm corpus`` as a user types it: a mistake is one line on stderr and exit 2, and
    ``--debug`` shows the traceback."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    command = [sys.executable, "-m", "topo_attn.lm", "corpus", "--check", str(tmp_path / "nothing.json")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    check_one_line_error(result.returncode, result.stderr, "--check", "no file")
    result = subprocess.run([*command, "--debug"], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert result.returncode == 2 and "Traceback (most recent call last)" in result.stderr


def test_the_parser_has_the_subcommand():
    from topo_attn.lm.__main__ import build_parser

    args = build_parser().parse_args(["corpus", "--check", "m.json", "--root", "stdlib=/x", "--root",
                                      "site-packages=/y"])
    assert args.command == "corpus" and args.check == "m.json" and args.root == ["stdlib=/x", "site-packages=/y"]
    assert corpus.build_parser().prog == "python -m topo_attn.lm corpus"
