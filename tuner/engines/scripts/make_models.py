"""Generate the embedded default models: a small Llama target, two drafts that share its tokenizer, and
an EAGLE-3 and an EAGLE head for it.

Run by the tuner with the *engine environment's* Python (it needs torch, transformers and tokenizers,
which the tuner itself never imports):

    python make_models.py CORPUS OUT_DIR [--shape tiny|llama-8b] [--device cpu|cuda]

Writes OUT_DIR/target, OUT_DIR/draft-2l, OUT_DIR/draft-1l, OUT_DIR/eagle3-head and OUT_DIR/eagle-head,
then OUT_DIR/DONE. Deterministic for
a given corpus: the weights come from a fixed torch seed. The default shape ``tiny`` (what the tuner
generates) is built on the CPU in float32 and saved in bfloat16. ``--shape llama-8b`` builds a
Llama-3.1-8B-shaped target (hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate 14336) with
the same tokenizer, so its vocabulary is this tokenizer's 8192 entries, not Llama's 128256; build it
with ``--device cuda`` (about 16 GB in bfloat16).

Why the drafts agree with the target: random weights give a draft near-zero acceptance. So the
target is built as "draft layers + extra layers whose residual contribution is scaled down": the
target's first two layers are ordinary, its later layers have their output projections scaled by
``EXTRA_LAYER_SCALE``. ``draft-2l`` is exactly those first two layers with the same embeddings, norm
and head, so it predicts the target's greedy token most of the time; ``draft-1l`` keeps only the first
layer and so agrees less often. Which draft pays off is then a real, measurable question.

The heads are shaped like the published ones (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, the EAGLE-LLaMA3
heads), so both engines load them as they would a trained head; their weights are random, so their
acceptance is near zero. What they prove is that every method boots and is measured.

* ``eagle3-head``: one decoder layer whose attention reads the token embedding and the hidden state
  side by side (2 x hidden wide), ``fc`` fusing three of the target's hidden states (3 x hidden to
  hidden), ``hidden_norm``, a final ``norm``, its own smaller draft vocabulary (``draft_vocab_size``,
  the corpus's most frequent tokens) with its ``lm_head``, and the mappings to the target's: ``d2t``
  (target id minus draft id) and ``t2d`` (which target ids the draft has). No embeddings: the engines
  share the target's. ``eagle_config.eagle_aux_hidden_state_layer_ids`` names the target layers it
  reads (``eagle3_aux_layers``).
* ``eagle-head``: EAGLE-1's ``fc`` over the embedding and the hidden state (2 x hidden to hidden), one
  decoder layer without its input norm, and a copy of the target's embeddings; the target's head
  reads its output. Its architectures name both engines' classes for it: SGLang's
  ``LlamaForCausalLMEagle`` and vLLM's ``EagleLlamaForCausalLM`` (each engine takes the first it knows).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB_SIZE = 8192
TARGET_LAYERS = 4
EXTRA_LAYER_SCALE = 0.02
SHAPE = dict(
    hidden_size=256,
    intermediate_size=768,
    num_attention_heads=4,  # head_dim 64: the CPU attention kernels reject 16
    num_key_value_heads=4,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    initializer_range=0.05,
)
# Other shapes for ``--shape``: (target layers, extra-layer scale, Llama config keys). "tiny" is the
# default above and must stay exactly that: the tuner's cache key hashes this file, not its output.
SHAPES: dict[str, tuple[int, float, dict[str, object]]] = {
    "tiny": (TARGET_LAYERS, EXTRA_LAYER_SCALE, SHAPE),
    "llama-8b": (
        32,
        0.01,  # 30 extra layers: a smaller share each keeps the 2-layer draft's greedy token on top
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=8192,  # the rag preset's longest prompt and answer, unscaled
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            tie_word_embeddings=False,
            initializer_range=0.02,
        ),
    ),
}
HEAD_SEED = 4321
DRAFT_VOCAB_SHARE = 4  # the EAGLE-3 head's vocabulary is this many times smaller than the target's
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"  # the name both engines register for a Llama EAGLE-3 head
EAGLE_ARCHITECTURES = ["LlamaForCausalLMEagle", "EagleLlamaForCausalLM"]  # SGLang's, then vLLM's
SPECIAL = ["<unk>", "<s>", "</s>"]
# Role-tagged turns, so /v1/chat/completions works. The tuner renders the same text in Python to
# count chat prompts exactly as the server does (tuner/workloads/chat_format.py): change both together.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def train_tokenizer(corpus: Path) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train([str(corpus)], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def llama_config(
    layers: int, vocab: int, tok: PreTrainedTokenizerFast, shape: dict[str, object] | None = None
) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab,
        num_hidden_layers=layers,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        **(SHAPE if shape is None else shape),
    )


def build_target(cfg: LlamaConfig, scale: float = EXTRA_LAYER_SCALE) -> LlamaForCausalLM:
    torch.manual_seed(1234)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers[2:]:
            layer.self_attn.o_proj.weight.mul_(scale)
            layer.mlp.down_proj.weight.mul_(scale)
    return model


def build_draft(
    target: LlamaForCausalLM, layers: int, tok: PreTrainedTokenizerFast, shape: dict[str, object] | None = None
) -> LlamaForCausalLM:
    draft = LlamaForCausalLM(llama_config(layers, target.config.vocab_size, tok, shape))
    state = {
        k: v
        for k, v in target.state_dict().items()
        if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers
    }
    draft.load_state_dict(state)
    return draft


def save(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, out: Path) -> None:
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    # transformers 5 writes the template to chat_template.jinja; keep it in tokenizer_config.json too,
    # where older loaders (and the tuner's own check) look for it
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2))


def _head_config(target: LlamaForCausalLM, architectures: list[str], **extra: object) -> dict[str, object]:
    """A one-layer Llama config of the target's width, as a head's ``config.json`` holds it."""
    config = target.config.to_dict()
    config.update(num_hidden_layers=1, architectures=architectures, torch_dtype="bfloat16", **extra)
    config.pop("dtype", None)
    return config


def _layer(prefix: str, dims: tuple[int, int, int, float], attn_in: int, input_norm: bool) -> dict[str, torch.Tensor]:
    """One decoder layer's weights under ``prefix``, attention reading ``attn_in`` features."""
    hidden, inter, kv, std = dims
    weights = {
        f"{prefix}.self_attn.q_proj.weight": torch.randn(hidden, attn_in) * std,
        f"{prefix}.self_attn.k_proj.weight": torch.randn(kv, attn_in) * std,
        f"{prefix}.self_attn.v_proj.weight": torch.randn(kv, attn_in) * std,
        f"{prefix}.self_attn.o_proj.weight": torch.randn(hidden, hidden) * std,
        f"{prefix}.mlp.gate_proj.weight": torch.randn(inter, hidden) * std,
        f"{prefix}.mlp.up_proj.weight": torch.randn(inter, hidden) * std,
        f"{prefix}.mlp.down_proj.weight": torch.randn(hidden, inter) * std,
        f"{prefix}.post_attention_layernorm.weight": torch.ones(hidden),
    }
    if input_norm:
        weights[f"{prefix}.input_layernorm.weight"] = torch.ones(hidden)
    return weights


def _dims(target: LlamaForCausalLM) -> tuple[int, int, int, float]:
    """Hidden size, MLP width, K/V projection width and the initialiser's spread of the target."""
    c = target.config
    head_dim = c.hidden_size // c.num_attention_heads
    return c.hidden_size, c.intermediate_size, c.num_key_value_heads * head_dim, c.initializer_range


def eagle3_aux_layers(layers: int) -> list[int]:
    """The target layers the EAGLE-3 head reads: the engines' own default (low, middle, high) where the
    target is deep enough, else its first three (SGLang captures the input of the layer after each id,
    so every id must leave a layer above it)."""
    return [2, layers // 2, layers - 3] if layers >= 8 else [0, 1, 2]


def frequent_tokens(tok: PreTrainedTokenizerFast, corpus: Path, n: int) -> list[int]:
    """The ``n`` most frequent token ids of the corpus, in id order: the EAGLE-3 head's draft vocabulary."""
    counts = torch.bincount(torch.tensor(tok(corpus.read_text())["input_ids"]), minlength=len(tok))
    return sorted(torch.argsort(counts, descending=True, stable=True)[:n].tolist())


def build_eagle3_head(
    target: LlamaForCausalLM, tok: PreTrainedTokenizerFast, corpus: Path
) -> tuple[dict[str, object], dict[str, torch.Tensor]]:
    torch.manual_seed(HEAD_SEED)
    dims = _dims(target)
    hidden, std = dims[0], dims[3]
    vocab = target.config.vocab_size
    draft_vocab = frequent_tokens(tok, corpus, vocab // DRAFT_VOCAB_SHARE)
    ids = torch.tensor(draft_vocab, dtype=torch.long)
    weights = _layer("midlayer", dims, 2 * hidden, input_norm=True)
    weights.update(
        {
            "midlayer.hidden_norm.weight": torch.ones(hidden),
            "norm.weight": torch.ones(hidden),
            "fc.weight": torch.randn(hidden, 3 * hidden) * std,
            "lm_head.weight": torch.randn(len(draft_vocab), hidden) * std,
        }
    )
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[ids] = True
    mapping = {"d2t": ids - torch.arange(len(draft_vocab)), "t2d": mask}
    aux = {"eagle_aux_hidden_state_layer_ids": eagle3_aux_layers(target.config.num_hidden_layers)}
    config = _head_config(
        target, [EAGLE3_ARCHITECTURE], draft_vocab_size=len(draft_vocab),
        eagle_config={**aux, "use_aux_hidden_state": True},
    )  # fmt: skip
    return config, {**{k: v.to(torch.bfloat16) for k, v in weights.items()}, **mapping}


def build_eagle_head(target: LlamaForCausalLM) -> tuple[dict[str, object], dict[str, torch.Tensor]]:
    torch.manual_seed(HEAD_SEED + 1)
    dims = _dims(target)
    hidden, std = dims[0], dims[3]
    weights = _layer("layers.0", dims, hidden, input_norm=False)
    weights["fc.weight"] = torch.randn(hidden, 2 * hidden) * std
    weights["embed_tokens.weight"] = target.model.embed_tokens.weight.detach().clone()
    return _head_config(target, list(EAGLE_ARCHITECTURES)), {k: v.to(torch.bfloat16) for k, v in weights.items()}


def build_heads(target: LlamaForCausalLM, tok: PreTrainedTokenizerFast, corpus: Path, out: Path) -> None:
    """Both heads of ``target``, built on the CPU (a head is one layer wide, whatever the target's size)."""
    save_head(*build_eagle3_head(target, tok, corpus), out / "eagle3-head")
    save_head(*build_eagle_head(target), out / "eagle-head")


def save_head(config: dict[str, object], weights: dict[str, torch.Tensor], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    save_file({k: v.contiguous().cpu() for k, v in weights.items()}, str(out / "model.safetensors"), {"format": "pt"})


def main(corpus: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(corpus)
    target = build_target(llama_config(TARGET_LAYERS, len(tok), tok))
    drafts = {"draft-2l": build_draft(target, 2, tok), "draft-1l": build_draft(target, 1, tok)}
    build_heads(target, tok, corpus, out)
    save(target, tok, out / "target")
    for name, draft in drafts.items():
        save(draft, tok, out / name)
    info = {"target_layers": TARGET_LAYERS, "extra_layer_scale": EXTRA_LAYER_SCALE, **SHAPE}
    (out / "DONE").write_text(json.dumps(info, indent=1))


def main_shape(corpus: Path, out: Path, shape_name: str, device: str) -> None:
    """Another shape: built directly on ``device`` in bfloat16 (an 8B model in float32 on a CPU
    would take minutes), with the same tokenizer, seed and draft construction as ``main``."""
    layers, scale, shape = SHAPES[shape_name]
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(corpus)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            target = build_target(llama_config(layers, len(tok), tok, shape), scale)
            drafts = {"draft-2l": build_draft(target, 2, tok, shape), "draft-1l": build_draft(target, 1, tok, shape)}
    finally:
        torch.set_default_dtype(previous)
    build_heads(target, tok, corpus, out)
    save(target, tok, out / "target")
    for name, draft in drafts.items():
        save(draft, tok, out / name)
    info = {"shape": shape_name, "device": device, "target_layers": layers, "extra_layer_scale": scale, **shape}
    (out / "DONE").write_text(json.dumps(info, indent=1))


def _cli(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Generate an agreeing target/draft model family.")
    parser.add_argument("corpus", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--device", default="cpu", help="where to build a non-default shape (e.g. cuda)")
    args = parser.parse_args(argv)
    if args.shape == "tiny" and args.device == "cpu":
        main(args.corpus, args.out)  # exactly what the tuner generates
    else:
        main_shape(args.corpus, args.out, args.shape, args.device)


if __name__ == "__main__":
    _cli(sys.argv[1:])
