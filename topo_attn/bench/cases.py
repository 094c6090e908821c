"""The benchmark cases: :class:`Case` (one shape) and :data:`SUITES` (the cases of each suite of
``python -m topo_attn.bench``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..schedule import num_blocks


@dataclass(frozen=True)
class Case:
    """One benchmark shape: ``batch x heads`` query lanes of ``seq_len`` tokens and ``head_dim`` (``kv_heads``
    key/value heads, fewer than ``heads`` for grouped-query attention), blocks of ``block_size`` tokens, the
    torch dtype named by ``dtype``, and the schedule rule (``window``, ``sinks``, ``topk``). ``topk=None`` means
    #22's choice, ``num_blocks // 8`` (at least 1). In the ``decode`` suite the query is one token (the last
    position) and ``seq_len`` is the key/value length."""

    name: str
    batch: int
    heads: int
    kv_heads: int
    seq_len: int
    head_dim: int
    block_size: int
    dtype: str
    window: int = 1
    sinks: int = 1
    topk: int | None = None

    @property
    def rule_topk(self) -> int:
        """The case's ``topk``, or #22's choice when it is None: ``num_blocks // 8``, at least 1."""
        return self.topk if self.topk is not None else max(1, num_blocks(self.seq_len, self.block_size) // 8)


def llm_case(S: int, block: int, B: int = 1, H: int = 32, H_kv: int = 32, D: int = 128) -> Case:
    """An LLM-sized bf16 case, named like ``B1 H32 kv8 S16k D128 b64`` (``kv`` only when ``H_kv != H``)."""
    kv = "" if H_kv == H else f" kv{H_kv}"
    return Case(f"B{B} H{H}{kv} S{S // 1024}k D{D} b{block}", B, H, H_kv, S, D, block, "bfloat16")


def decode_case(N: int, block: int, B: int = 1, H: int = 32, H_kv: int = 8, D: int = 128) -> Case:
    """A bf16 decode case: one query token against ``N`` keys and values (``seq_len=N``), named like the llm
    cases with ``q1`` and the key/value length, e.g. ``B8 H32 kv8 q1 S128k D128 b64``."""
    kv = "" if H_kv == H else f" kv{H_kv}"
    return Case(f"B{B} H{H}{kv} q1 S{N // 1024}k D{D} b{block}", B, H, H_kv, N, D, block, "bfloat16")


BUILD_LENGTHS = (2048, 4096, 8192, 16384, 32768, 65536, 131072)
"""Sequence lengths of the ``build`` suite (B=1, H=32, D=128, blocks of 64 and 128)."""

SUITES: dict[str, list[Case]] = {
    # triton-lang/kernels#22's own table: one head, fp16, dim 64, block 64, window 1, one sink, top-k n/8
    "pr": [Case(f"S{S}", 1, 1, 1, S, 64, 64, "float16") for S in (1024, 2048, 4096)],
    "llm": [llm_case(S, b) for b in (64, 128) for S in (4096, 16384, 32768, 65536)]
    + [llm_case(16384, 64, H=16, H_kv=16, D=64), llm_case(8192, 64, B=4), llm_case(8192, 128, B=4),
       llm_case(16384, 128, H_kv=8), llm_case(16384, 64, H_kv=8)],
    # schedule construction next to the attention it serves (topo_attn.bench.build)
    "build": [llm_case(S, b) for b in (64, 128) for S in BUILD_LENGTHS],
    # forward + backward against SDPA and FlexAttention (topo_attn.bench.train)
    "train": [llm_case(S, b) for b in (64, 128) for S in (16384, 32768)] + [llm_case(16384, 128, H_kv=8)],
    # selection quality against build + attention time on the captured real q, k, v (topo_attn.bench.select)
    "select": [Case("MiniLM real q/k/v b16", 2, 12, 12, 512, 32, 16, "float16")],
    # a 1B-shaped Llama's prefill through transformers: the no-attention floor, SDPA, FlexAttention and the kit's
    # backend with every selector (topo_attn.bench.model; heads, kv heads and head dim here, the rest of the
    # shape in model.LLAMA_1B)
    "model": [Case(f"Llama-1B-shape B1 S{S // 1024}k b64", 1, 32, 8, S, 64, 64, "bfloat16")
              for S in (8192, 32768, 65536, 131072)],
    # one query token against a 32k / 128k key/value cache: the split-K decode path against SDPA's and
    # FlexAttention's dense decoding, dense and 1/8 schedules (topo_attn.bench.decode)
    "decode": [decode_case(N, 64, B=B) for B in (1, 8) for N in (32768, 131072)],
    # greedy generate() after a 32k / 128k context with a static cache and the compiled step: the recipe (SDPA),
    # the kit dense and its fixed-shape selectors at a 2048-token budget (topo_attn.bench.generate)
    "generate": [Case(f"Llama-1B-shape B{B} S{S // 1024}k b64", B, 32, 8, S, 64, 64, "bfloat16")
                 for B in (1, 8) for S in (32768, 131072)],
}
"""Suite name -> its cases, in the order they run."""

# one attention layer of the model suite's shape, its host time split into pieces (topo_attn.bench.host): the
# budget is the model suite's 2048 tokens (32 blocks)
SUITES["host"] = [Case(f"Llama-1B-shape layer B1 S{S // 1024}k b64", 1, 32, 8, S, 64, 64, "bfloat16", topk=32)
                  for S in (8192, 32768)]

# one layer's decode step over a static cache: each selector's update and table next to the decode it serves
# (topo_attn.bench.step), the generate suite's cases
SUITES["step"] = list(SUITES["generate"])
