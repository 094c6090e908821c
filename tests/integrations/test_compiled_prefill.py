"""The backend's whole-sequence call under torch.compile (``torch.ops.topo_attn.backend_prefill``), on tiny
Llama models with random weights, the Triton kernels in the interpreter on the CPU: the forward traces whole
(no graph break), the op is in the graph once per layer, the logits equal the eager forward's (which equal the
float64 reference's elsewhere), the op's fake output has the real one's layout, and what the op does not take
(gradients, selectors that wait for the host) is left to the eager path."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from topo_attn.integrations import transformers as tat  # noqa: E402

BLOCK = 16
VOCAB = 96
LAYERS = 2


def tiny_llama(device) -> LlamaForCausalLM:
    """2 layers, hidden 64, 4 query and 2 key/value heads of dim 16, random weights, float32."""
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                         initializer_range=0.1, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device).eval()


def token_ids(seq_len, device, seed=1):
    return torch.randint(1, VOCAB, (1, seq_len), generator=torch.Generator().manual_seed(seed)).to(device)


class GraphOps:
    """A torch.compile backend that counts frames and the kit's prefill ops in each graph, then runs it."""

    def __init__(self):
        self.frames, self.prefill_ops = 0, 0

    def __call__(self, gm, example_inputs):
        self.frames += 1
        op = torch.ops.topo_attn.backend_prefill
        self.prefill_ops += sum(node.target in (op, op.default) for node in gm.graph.nodes)
        return gm.forward


@pytest.mark.parametrize("selector", ["dense", "centroid", "topology"])
def test_a_prefill_compiles_whole_with_one_op_per_layer(selector, device):
    model = tiny_llama(device)
    name = tat.register(selector=selector, block_size=BLOCK, budget=1, name=f"topo_compiled_{selector}")
    model.set_attn_implementation(name)
    ids = token_ids(70, device)
    backend = GraphOps()
    torch._dynamo.reset()
    forward = torch.compile(model.forward, backend=backend, fullgraph=True)
    with torch.no_grad():
        want = model(ids).logits
        stats = tat.last_stats(name)
        got = forward(ids).logits
    assert backend.frames == 1 and backend.prefill_ops == LAYERS
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert stats and tat.last_stats(name) == stats  # the compiled calls recorded nothing
    torch._dynamo.reset()


def test_the_op_equals_the_eager_call_and_its_fake_has_the_same_layout(device):
    """Called directly: the output of the eager backend call before its [B, S, H, D] copy, in q's layout (a
    transposed view of [B, S, H, D] memory, as a model passes it), and the fake output has those strides."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    name = tat.register(selector="quest", block_size=BLOCK, budget=1, name="topo_compiled_op")
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 150, h, 16, generator=gen).to(device).transpose(1, 2) for h in (4, 2, 2))
    out = torch.ops.topo_attn.backend_prefill(q, k, v, name, 0, 0.25)
    assert out.shape == q.shape and out.stride() == q.stride()
    module = type("Layer", (), {"layer_idx": 0, "is_causal": True})()
    eager, _ = _eager_call(name, module, q, k, v)
    torch.testing.assert_close(out.transpose(1, 2), eager, atol=0, rtol=0)
    assert tat.last_stats(name)[0].visited_fraction < 1  # the eager call ran quest's sparse schedule
    with FakeTensorMode() as mode:
        fake = torch.ops.topo_attn.backend_prefill(mode.from_tensor(q), mode.from_tensor(k), mode.from_tensor(v),
                                                   name, 0, 0.25)
    assert fake.shape == out.shape and fake.stride() == out.stride()


def _eager_call(name, module, q, k, v):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    with torch.no_grad():
        return ALL_ATTENTION_FUNCTIONS[name](module, q, k, v, None, scaling=0.25)


def test_only_gradient_free_sync_free_calls_take_the_op(monkeypatch):
    """The rule :func:`compiled_prefill` applies while tracing: dense layers and sync-free selectors without
    gradients take the op (``topology_22`` too: its padded schedule waits for nothing); a call with gradients
    (the op has none) or a selector whose schedule waits for the host (``oracle``, the cluster selectors) is
    traced as it runs eagerly; nothing takes the op outside tracing. (Tracing such a call into Triton's
    interpreter fails, so the CPU cannot compile it.)"""
    q = torch.randn(1, 4, 64, 16)
    k = torch.randn(1, 2, 64, 16)
    settings = {name: tat.registered(tat.register(selector=name, block_size=BLOCK, budget=1, dense_layers=(1,),
                                                  name=f"topo_rule_{name}"))
                for name in ("centroid", "topology", "topology_22", "oracle", "cluster")}
    assert not tat.compiled_prefill(settings["centroid"], 0, q, k, k)  # not tracing
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert tat.compiled_prefill(settings["centroid"], 0, q, k, k)
    assert tat.compiled_prefill(settings["topology"], 0, q, k, k)
    assert tat.compiled_prefill(settings["topology_22"], 0, q, k, k)
    for name in ("oracle", "cluster"):
        assert not tat.compiled_prefill(settings[name], 0, q, k, k), name
        assert tat.compiled_prefill(settings[name], 1, q, k, k), name  # its dense layer
    grad_q = q.clone().requires_grad_()
    assert not tat.compiled_prefill(settings["centroid"], 0, grad_q, k, k)
    with torch.no_grad():
        assert tat.compiled_prefill(settings["centroid"], 0, grad_q, k, k)


def test_the_op_selects_without_cached_graphs_and_defaults_its_scale(device, monkeypatch):
    """Inside the op the topology kernels may not replay cached graphs (under reduce-overhead the op runs in the
    compiled function's graph pool, where a cached graph's buffers would outlive the call); outside it they may.
    A scale of None is 1 / sqrt(D)."""
    from topo_attn.topology.gpu.graph import cached_graphs_allowed, no_cached_graphs

    seen = []
    real = tat.schedule_for

    def spy(*args, **kwargs):
        seen.append(cached_graphs_allowed())
        return real(*args, **kwargs)

    monkeypatch.setattr(tat, "schedule_for", spy)
    name = tat.register(selector="topology", block_size=BLOCK, budget=1, name="topo_compiled_graphs")
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 96, h, 16, generator=gen).to(device).transpose(1, 2) for h in (4, 2, 2))
    default = torch.ops.topo_attn.backend_prefill(q, k, v, name, 0, None)
    given = torch.ops.topo_attn.backend_prefill(q, k, v, name, 0, 0.25)
    assert seen == [False, False] and cached_graphs_allowed()
    torch.testing.assert_close(default, given, atol=0, rtol=0)  # 16 ** -0.5 == 0.25
    other = torch.ops.topo_attn.backend_prefill(q, k, v, name, 0, 0.5)
    assert not torch.allclose(other, given, atol=1e-3)
    with no_cached_graphs():
        assert not cached_graphs_allowed()
        with no_cached_graphs():
            assert not cached_graphs_allowed()
        assert not cached_graphs_allowed()
    assert cached_graphs_allowed()


def test_the_op_keeps_no_dense_schedule(device, monkeypatch):
    """A dense layer's schedule is kept for reuse by eager calls, but the op neither keeps one (under
    reduce-overhead it would live in the compiled function's graph pool past the call) nor needs one kept: it
    uses a kept one if there is one, else builds it each call; its output equals the eager call's."""
    built = []
    real = tat.dense_causal_schedule

    def counting(*args, **kwargs):
        built.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(tat, "dense_causal_schedule", counting)
    name = tat.register(selector="dense", block_size=BLOCK, name="topo_op_dense")
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 80, h, 16, generator=gen).to(device).transpose(1, 2) for h in (4, 2, 2))
    ops = [torch.ops.topo_attn.backend_prefill(q, k, v, name, 0, 0.25) for _ in range(2)]
    assert len(built) == 2  # built afresh each time, nothing kept
    module = type("Layer", (), {"layer_idx": 0, "is_causal": True})()
    eager = [_eager_call(name, module, q, k, v)[0] for _ in range(2)]
    assert len(built) == 3  # the eager call keeps the one it built
    torch.ops.topo_attn.backend_prefill(q, k, v, name, 0, 0.25)
    assert len(built) == 3  # and the op reuses it
    for out in ops:
        torch.testing.assert_close(out.transpose(1, 2), eager[0], atol=0, rtol=0)


@pytest.mark.cuda
def test_reduce_overhead_replays_dense_then_topology_then_centroid():
    """Compiled with CUDA graphs (``mode="reduce-overhead"``), one forward after another as the model suite runs
    them: each replays and equals its eager logits; no buffer of the op's outlives a call in the graph pool
    (cudagraph trees raise if one does). In float32: in bfloat16 the compiled model rounds its keys differently
    from the eager one (fused norms and products), which moves the choice of a selector between near-tied blocks.
    The tolerance adds twice SDPA's own compiled-against-eager difference."""
    model = tiny_llama("cuda")
    ids = token_ids(256, "cuda")

    def eager_and_compiled():
        with torch.no_grad():
            want = model(ids, use_cache=False).logits.float()
            torch._dynamo.reset()
            forward = torch.compile(model.forward, mode="reduce-overhead")
            for _ in range(3):  # warm-up, record, replay
                got = forward(ids, use_cache=True).logits.float()
        return got, want

    model.set_attn_implementation("sdpa")
    got, want = eager_and_compiled()
    rounding = (got - want).abs().max().item()
    for selector in ("dense", "topology", "centroid"):
        name = tat.register(selector=selector, block_size=BLOCK, budget=2, name=f"topo_graphs_{selector}")
        model.set_attn_implementation(name)
        got, want = eager_and_compiled()
        torch.testing.assert_close(got, want, atol=2e-2 + 2 * rounding, rtol=2e-2,
                                   msg=lambda m, s=selector: f"{s} (SDPA's compiled rounding {rounding:.3g}): {m}")
    torch._dynamo.reset()
