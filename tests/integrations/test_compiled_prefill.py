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
    gradients take the op; a call with gradients (the op has none) or a selector whose schedule waits for the
    host (``topology_22``, ``oracle``, the cluster selectors) is traced as it runs eagerly; nothing takes the op
    outside tracing. (Tracing such a call into Triton's interpreter fails, so the CPU cannot compile it.)"""
    q = torch.randn(1, 4, 64, 16)
    k = torch.randn(1, 2, 64, 16)
    settings = {name: tat.registered(tat.register(selector=name, block_size=BLOCK, budget=1, dense_layers=(1,),
                                                  name=f"topo_rule_{name}"))
                for name in ("centroid", "topology", "topology_22", "oracle", "cluster")}
    assert not tat.compiled_prefill(settings["centroid"], 0, q, k, k)  # not tracing
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert tat.compiled_prefill(settings["centroid"], 0, q, k, k)
    assert tat.compiled_prefill(settings["topology"], 0, q, k, k)
    for name in ("topology_22", "oracle", "cluster"):
        assert not tat.compiled_prefill(settings[name], 0, q, k, k), name
        assert tat.compiled_prefill(settings[name], 1, q, k, k), name  # its dense layer
    grad_q = q.clone().requires_grad_()
    assert not tat.compiled_prefill(settings["centroid"], 0, grad_q, k, k)
    with torch.no_grad():
        assert tat.compiled_prefill(settings["centroid"], 0, grad_q, k, k)
