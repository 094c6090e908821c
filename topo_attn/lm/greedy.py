"""``python -m topo_attn.lm greedy``: whether the kit's dense decode generates the same greedy tokens as SDPA's,
on a trained model.

Issue 40 asks the kit's dense step for greedy tokens identical to transformers' fast-decoding recipe. The
``generate`` benchmark checks that on its random-weight model, whose logits lie so close together that one
rounding difference flips a token. Here the model is a trained one (default ``data/lm``): the first
``--documents`` held-out documents, cut to each ``--prompt-lengths`` bytes, are continued greedily for
``--new-tokens`` bytes by four paths, all on the same batch:

- ``sdpa static`` (the reference): SDPA with ``cache_implementation="static"``, which ``generate()`` compiles
  on a GPU (transformers' recipe);
- ``sdpa dynamic``: SDPA with its ``DynamicCache``, eager; how far SDPA's own two paths agree;
- ``kit dense dynamic``: the kit's backend (``selector="dense"``) with a
  :class:`~topo_attn.integrations.cache.TopoCache`, eager;
- ``kit dense static``: the kit's backend with a
  :class:`~topo_attn.integrations.static_cache.TopoStaticCache`, compiled by ``generate()`` on a GPU.

Each row: ``prompt_length``, ``path``, ``first_difference`` (per sequence, the index of the first generated
token that differs from the reference's; ``new_tokens`` when none does) and ``identical`` (all equal).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from .. import cli
from ..provenance import run_record
from .results import LM_GREEDY_SUITE
from .study import add_common_arguments, check_common_arguments, eval_set_path, load_documents, load_model

PROG = "python -m topo_attn.lm greedy"
BACKEND = "topo_attn_greedy"
REFERENCE = "sdpa static"
PATHS = (REFERENCE, "sdpa dynamic", "kit dense dynamic", "kit dense static")
"""The decoding paths, the reference first."""


def first_differences(tokens: torch.Tensor, reference: torch.Tensor) -> list[int]:
    """Per row of ``tokens [B, T]``, the index of the first token that differs from ``reference [B, T]``
    (``T`` when none does)."""
    differs = tokens != reference
    first = torch.where(differs.any(-1), differs.int().argmax(-1), torch.full_like(differs[:, 0], tokens.shape[1],
                                                                                   dtype=torch.long))
    return [int(i) for i in first.tolist()]


def greedy_tokens(model, prompt: torch.Tensor, new_tokens: int, path: str, block_size: int) -> torch.Tensor:
    """The ``new_tokens`` greedy tokens ``model`` generates after ``prompt [B, P]`` along ``path`` (one of
    :data:`PATHS`): ``[B, new_tokens]``."""
    from ..integrations import transformers as tat
    from ..integrations.cache import TopoCache, cache_argument
    from ..integrations.static_cache import TopoStaticCache

    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                  eos_token_id=None)
    if path.startswith("sdpa"):
        model.set_attn_implementation("sdpa")
        if path == REFERENCE:
            kwargs["cache_implementation"] = "static"
    else:
        model.set_attn_implementation(tat.register(selector="dense", block_size=block_size, name=BACKEND))
        cache = (TopoCache() if path == "kit dense dynamic"
                 else TopoStaticCache(model.config, max_cache_len=prompt.shape[1] + new_tokens))
        kwargs.update(cache_argument(cache))
    torch._dynamo.reset()  # each compiled path compiles its own step
    with torch.no_grad():
        return model.generate(prompt, **kwargs)[:, prompt.shape[1]:]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, "held-out documents the prompts are cut from (one sequence each)")
    for action in parser._actions:
        if action.dest == "documents":
            action.default = 4
            action.help = "held-out documents the prompts are cut from, one sequence each (default 4)"
    parser.add_argument("--prompt-lengths", type=int, nargs="+", default=[4000, 7000],
                        help="prompt bytes (each at most the document length)")
    parser.add_argument("--new-tokens", type=int, default=96, help="greedy tokens generated per prompt")


def check_arguments(args: argparse.Namespace) -> None:
    """:func:`~.study.check_common_arguments`, and prompt lengths and new tokens of at least 1."""
    check_common_arguments(args)
    cli.check_at_least("--prompt-lengths", args.prompt_lengths, 1, "length")
    cli.check_at_least("--new-tokens", args.new_tokens, 1)


def greedy_agreement(args: argparse.Namespace, argv: list[str] | None = None) -> dict:
    """The rows of the module docstring for every prompt length; the results as a dict (and JSON at
    ``args.out``). Raises ``ValueError`` when a prompt and its new tokens exceed the documents or the model's
    positions."""
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device != "cpu" else torch.float32)
    model = load_model(args.model, args.device, dtype)
    docs = load_documents(eval_set_path(args), args.documents, args.length)
    positions = model.config.max_position_embeddings
    for length in args.prompt_lengths:
        if length > docs.shape[1] or length + args.new_tokens > positions:
            raise ValueError(f"a prompt of {length} bytes needs documents of at least that length (these have "
                             f"{docs.shape[1]}) and {length + args.new_tokens} positions (the model has {positions})")
    started = time.perf_counter()
    rows = []
    for length in args.prompt_lengths:
        prompt = torch.from_numpy(docs[:, :length].astype("int64")).to(args.device)
        tokens = {path: greedy_tokens(model, prompt, args.new_tokens, path, args.block_size) for path in PATHS}
        for path in PATHS:
            first = first_differences(tokens[path], tokens[REFERENCE])
            rows.append(dict(prompt_length=length, path=path, sequences=len(first), new_tokens=args.new_tokens,
                             first_difference=first, identical=all(f == args.new_tokens for f in first)))
    result = dict(suite=LM_GREEDY_SUITE, model=str(args.model),
                  **run_record(args.device, f"{PROG} " + " ".join(argv if argv is not None else sys.argv[2:])),
                  reference=REFERENCE,
                  block_size=args.block_size, dtype=str(dtype).removeprefix("torch."), rows=rows,
                  seconds=time.perf_counter() - started)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


def markdown(result: dict) -> str:
    """Per prompt length and path: the first differing token of each sequence and whether all are identical."""
    lines = ["| prompt bytes | path | first differing token per sequence | identical |", "| --- | --- | --- | --- |"]
    for r in result["rows"]:
        first = ", ".join("-" if f == r["new_tokens"] else str(f) for f in r["first_difference"])
        lines.append(f"| {r['prompt_length']} | {r['path']} | {first} | {'yes' if r['identical'] else 'no'} |")
    return "\n".join(lines)


def build_parser(add_help: bool = True) -> argparse.ArgumentParser:
    """``python -m topo_attn.lm greedy``'s command line (``add_help=False``: as a parent parser)."""
    return cli.command_parser(PROG, __doc__, add_arguments, add_help)


def main(argv: list[str] | None = None) -> int:
    """The command line (``argv`` without ``greedy``; ``sys.argv[2:]`` when None): print the table. Raises
    :class:`~topo_attn.cli.UsageError` for a bad value before anything loads."""
    argv = sys.argv[2:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    check_arguments(args)
    print(markdown(greedy_agreement(args, argv)))
    return 0
