"""The byte-level corpus: a deterministic, disjoint train/validation split by file name, and documents cut
from the packed stream."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from topo_attn.lm import corpus


def write_tree(root, count: int, seed: int = 0) -> None:
    """``count`` small Python files in nested folders, plus files the corpus must leave out."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        path = root / f"pkg{i % 7}" / f"mod_{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# module {i}\nVALUE_{i} = {int(rng.integers(1 << 30))}\n" * int(rng.integers(1, 5)))
    (root / "empty.py").write_text("")
    (root / "binary.py").write_bytes(b"x = 1\0\n")
    (root / "notes.txt").write_text("not Python")


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "lib"
    write_tree(root, 300)
    return [("stdlib", root)]


def test_is_validation_is_the_documented_hash():
    for name in ("stdlib/json/decoder.py", "site-packages/numpy/linalg/_linalg.py", "x.py"):
        digest = hashlib.sha256(name.encode()).digest()
        assert corpus.is_validation(name, 37) == (int.from_bytes(digest[:8], "little") % 100 < 37)
    names = [f"stdlib/m{i}.py" for i in range(2000)]
    share = np.mean([corpus.is_validation(n) for n in names])
    assert 0.01 < share < 0.035  # about VALIDATION_PERCENT = 2
    assert not any(corpus.is_validation(n, 0) for n in names)
    assert all(corpus.is_validation(n, 100) for n in names)


def test_find_sources_names_sizes_hashes_and_exclusions(tree):
    files = corpus.find_sources(tree)
    names = [f.name for f in files]
    assert len(files) == 300 and names == sorted(names) and len(set(names)) == 300
    assert "stdlib/pkg0/mod_0.py" in names
    assert not {"stdlib/empty.py", "stdlib/binary.py", "stdlib/notes.txt"} & set(names)
    for f in files[:20]:
        data = f.path.read_bytes()
        assert f.size == len(data) and f.sha256 == hashlib.sha256(data).hexdigest()
    small = corpus.find_sources(tree, max_bytes=40)
    assert all(f.size <= 40 for f in small) and len(small) < len(files)


def test_split_is_deterministic_disjoint_and_independent_of_the_location(tmp_path, tree):
    train, validation = corpus.split_sources(corpus.find_sources(tree), percent=20)
    names_t, names_v = {f.name for f in train}, {f.name for f in validation}
    assert names_t.isdisjoint(names_v) and len(names_t | names_v) == 300
    assert 30 < len(names_v) < 90  # about 20 percent
    assert all(corpus.is_validation(n, 20) for n in names_v)
    # the same files elsewhere, found again: the same split
    moved = tmp_path / "elsewhere" / "lib"
    write_tree(moved, 300)
    again_t, again_v = corpus.split_sources(corpus.find_sources([("stdlib", moved)]), percent=20)
    assert [f.name for f in again_t] == [f.name for f in train]
    assert [f.name for f in again_v] == [f.name for f in validation]
    # another root kind renames every file, and so draws another split
    other_t, _ = corpus.split_sources(corpus.find_sources([("site-packages", moved)]), percent=20)
    assert {f.name.split("/", 1)[1] for f in other_t} != {n.split("/", 1)[1] for n in names_t}


def test_a_nested_root_counts_its_files_once(tmp_path):
    outer = tmp_path / "lib"
    write_tree(outer, 20)
    inner = outer / "site-packages"
    write_tree(inner, 10, seed=1)
    files = corpus.find_sources([("stdlib", outer), ("site-packages", inner)])
    assert len(files) == 30
    assert sum(f.name.startswith("site-packages/") for f in files) == 10


def test_pack_and_documents(tree):
    files = corpus.find_sources(tree)[:10]
    stream = corpus.pack(files)
    expected = b"".join(f.path.read_bytes() + corpus.SEPARATOR for f in files)
    assert stream.dtype == np.uint8 and stream.tobytes() == expected
    shuffled = corpus.pack(files, seed=3)
    assert sorted(shuffled.tobytes()) == sorted(expected) and shuffled.tobytes() != expected
    assert corpus.pack(files, seed=3).tobytes() == shuffled.tobytes()
    # seeded: in the order of a seeded hash of each file's content (tests/lm/test_eval_set.py: adding a file)
    ordered = corpus.packing_order(files, 3)
    assert shuffled.tobytes() == b"".join(f.path.read_bytes() + corpus.SEPARATOR for f in ordered)
    assert corpus.pack(files[::-1], seed=3).tobytes() == shuffled.tobytes()  # not by the files' places
    docs = corpus.documents(stream, 50)
    assert docs.shape == (len(stream) // 50, 50) and docs.tobytes() == stream[: docs.size].tobytes()
    assert corpus.documents(stream, 50, 2).shape == (2, 50)


def test_errors(tmp_path, tree):
    with pytest.raises(ValueError, match="hold no Python source files"):
        corpus.find_sources([("stdlib", tmp_path / "nothing")])
    with pytest.raises(ValueError, match="files must not be empty"):
        corpus.pack([])
    stream = np.arange(100, dtype=np.uint8)
    with pytest.raises(ValueError, match="fewer than 3"):
        corpus.documents(stream, 40, 3)
    with pytest.raises(ValueError, match="length must be >= 1"):
        corpus.documents(stream, 0)
    with pytest.raises(TypeError, match="length must be an int"):
        corpus.documents(stream, 4.0)


def test_manifest_records_every_file_and_side(tree):
    train, validation = corpus.split_sources(corpus.find_sources(tree), percent=20)
    record = corpus.manifest(train, validation)
    assert record["train_files"] == len(train) and record["validation_files"] == len(validation)
    assert record["train_bytes"] == sum(f.size for f in train)
    sides = {f["name"]: f["side"] for f in record["files"]}
    assert {n for n, s in sides.items() if s == "validation"} == {f.name for f in validation}
    assert "numpy" in {k.lower() for k in record["packages"]} and record["python"]
