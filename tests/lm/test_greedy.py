"""``python -m topo_attn.lm greedy`` (topo_attn.lm.greedy) on a tiny random Llama saved to disk: the first
differing token against a hand-made case, each path's tokens against a hand-written greedy loop with SDPA (in
float32 on the CPU every path agrees), the kit's paths really running the kit's backend, the JSON and table, and
usage errors before anything loads. On the CPU the kernels run in Triton's interpreter."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers import DEVICE, save_tiny_lm  # in tests/: CUDA with the compiled kernels, else the CPU
from topo_attn import cli
from topo_attn.lm import greedy

transformers = pytest.importorskip("transformers", minversion="5")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny byte-level Llama and 3 held-out documents of 200 bytes (:func:`helpers.save_tiny_lm`)."""
    return save_tiny_lm(tmp_path_factory.mktemp("tiny_greedy_lm"), documents=3, length=200, positions=256)


def _argv(model_dir, *extra):
    return ["--model", str(model_dir), "--documents", "2", "--prompt-lengths", "70", "--new-tokens", "6",
            "--block-size", "16", "--device", DEVICE, "--dtype", "float32", *extra]


def test_first_differences():
    reference = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [1, 1, 1, 1]])
    tokens = torch.tensor([[1, 2, 3, 4], [5, 0, 7, 0], [0, 1, 1, 1]])
    assert greedy.first_differences(tokens, reference) == [4, 1, 0]


def test_every_path_is_the_greedy_continuation(model_dir):
    """Each path's tokens equal a hand-written greedy loop's (SDPA, no cache, float32), and the kit's paths go
    through the kit's backend (its calls counted)."""
    from topo_attn.integrations import transformers as tat

    model = greedy.load_model(model_dir, DEVICE, torch.float32)
    docs = np.load(model_dir / "eval_set.npz")["documents"]
    prompt = torch.from_numpy(docs[:2, :70].astype(np.int64)).to(DEVICE)
    ids = prompt
    with torch.no_grad():
        for _ in range(6):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    expected = ids[:, 70:]

    def calls() -> int:  # the kit backend's attention calls since its last registration (each kit path's)
        try:
            return sum(c for _, _, c in tat.visited_totals(greedy.BACKEND).values())
        except (KeyError, ValueError):
            return 0

    for path in greedy.PATHS:
        before = calls()
        tokens = greedy.greedy_tokens(model, prompt, 6, path, 16)
        assert torch.equal(tokens, expected), path
        if path.startswith("kit"):  # its prefill at least (a static cache's compiled steps record none)
            assert calls() > 0, path
        else:
            assert calls() == before, path


def test_json_rows_and_table(model_dir, tmp_path):
    out = tmp_path / "greedy.json"
    argv = _argv(model_dir, "--out", str(out))
    args = greedy.build_parser().parse_args(argv)
    greedy.check_arguments(args)
    result = greedy.greedy_agreement(args, argv)
    saved = json.loads(out.read_text())
    assert saved["suite"] == "lm_greedy" and saved["reference"] == "sdpa static"
    assert saved["command"] == "python -m topo_attn.lm greedy " + " ".join(argv)
    assert [r["path"] for r in saved["rows"]] == list(greedy.PATHS)
    for row in saved["rows"]:  # float32 on every path: the same tokens
        assert row["first_difference"] == [6, 6] and row["identical"] and row["sequences"] == 2
    table = greedy.markdown(result)
    assert table.count("\n") == 1 + len(greedy.PATHS) and "| 70 | kit dense static | -, - | yes |" in table


@pytest.mark.parametrize("extra, message", [
    (["--prompt-lengths", "0"], "--prompt-lengths"),
    (["--new-tokens", "0"], "--new-tokens"),
    (["--documents", "0"], "--documents"),
])
def test_usage_errors_name_the_argument(model_dir, extra, message):
    args = greedy.build_parser().parse_args(_argv(model_dir, *extra))
    with pytest.raises(cli.UsageError, match=message):
        greedy.check_arguments(args)


def test_a_prompt_longer_than_the_documents_is_refused(model_dir):
    args = greedy.build_parser().parse_args(_argv(model_dir, "--prompt-lengths", "250"))
    greedy.check_arguments(args)
    with pytest.raises(ValueError, match="prompt of 250 bytes"):
        greedy.greedy_agreement(args, [])


def test_the_lm_command_line_has_the_subcommand():
    from topo_attn.lm.__main__ import SUBCOMMANDS, build_parser

    assert SUBCOMMANDS["greedy"] == "greedy"
    assert build_parser().parse_args(["greedy", "--new-tokens", "3"]).new_tokens == 3
