"""Generate the embedded default models: a small Llama target and two drafts that share its tokenizer.

Run by the tuner with the *engine environment's* Python (it needs torch, transformers and tokenizers,
which the tuner itself never imports):

    python make_models.py CORPUS OUT_DIR [--shape tiny|llama-8b] [--device cpu|cuda]

Writes OUT_DIR/target, OUT_DIR/draft-2l and OUT_DIR/draft-1l, then OUT_DIR/DONE. Deterministic for
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
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
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


def main(corpus: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(corpus)
    target = build_target(llama_config(TARGET_LAYERS, len(tok), tok))
    drafts = {"draft-2l": build_draft(target, 2, tok), "draft-1l": build_draft(target, 1, tok)}
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
