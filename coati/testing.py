"""Small models and tokenizers built locally, for tests, examples, benchmarks and users' own tests (no hub access
needed); nothing in the package itself imports them.

``build_tiny_model(path)`` writes a Hugging Face folder (config, weights, tokenizer with a chat template) holding a
randomly initialised Llama or Qwen2 of a few hundred thousand parameters and a character-level tokenizer.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

__all__ = [
    "CHAT_TEMPLATE",
    "VLM_CHAT_TEMPLATE",
    "build_tiny_model",
    "build_tiny_reward_model",
    "build_tiny_vlm",
    "VLM_ARCHITECTURES",
    "char_tokenizer",
    "train_tiny_reward_model",
]

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ '<eos>' if m['role'] == 'assistant' else '' }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
"""role: content lines; an assistant turn ends with the end-of-sequence token the model stops at, as chat models'
templates do (a multi-turn episode's trained tokens are then the template's rendering)"""
SPECIAL = ["<pad>", "<eos>", "<bos>"]


def _special_ids(tokenizer) -> dict:
    """The tokenizer's pad, end and start token ids as a model config's fields."""
    return {
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id,
    }


def char_tokenizer(path: str | Path | None = None):
    """A character-level PreTrainedTokenizerFast over printable ASCII: pad 0, eos 1, bos 2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    for ch in string.printable:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    if path is not None:
        fast.save_pretrained(str(path))
    return fast


MOE_ARCHITECTURES = ("qwen3_moe", "mixtral", "olmoe", "qwen2_moe")
"""the mixture-of-experts families ``build_tiny_model`` writes: 8 experts, 2 routed per token (Qwen2-MoE adds its
shared expert)"""
ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3", "gpt2", *MOE_ARCHITECTURES)
"""the families ``build_tiny_model`` writes (each from its current transformers config)"""


VLM_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for part in m['content'] %}{{ '<image>' if part['type'] == 'image' else part['text'] }}{% endfor %}"
    "{% endif %}{{ '<eos>' if m['role'] == 'assistant' else '' }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
"""``CHAT_TEMPLATE`` with the Hugging Face chat format's image parts: each ``{"type": "image"}`` part is one
``<image>`` token, which the processor expands to the image's patch tokens"""


VLM_ARCHITECTURES = ("llava", "idefics3")
"""the vision-language families ``build_tiny_vlm`` writes: LLaVA (a CLIP tower, an MLP projector, Llama) and
Idefics3, SmolVLM's family (a SigLIP-style tower, a pixel-shuffle connector, Llama)"""


def build_tiny_vlm(
    path: str | Path,
    arch: str = "llava",
    hidden_size: int = 64,
    num_layers: int = 2,
    image_size: int | None = None,
    seed: int = 0,
) -> Path:
    """Write a random tiny vision-language model of family ``arch`` (``VLM_ARCHITECTURES``: a vision tower of two
    layers over ``image_size``-pixel squares, its projector or connector and a Llama decoder) with its processor (the
    character tokenizer plus the family's image tokens, the family's image processor in its PIL form,
    ``VLM_CHAT_TEMPLATE``) to ``path``; returns the path. ``AutoProcessor`` and ``AutoModelForImageTextToText`` load
    it."""

    if arch not in VLM_ARCHITECTURES:
        raise ValueError(f"arch must be one of {list(VLM_ARCHITECTURES)}, got {arch!r}")
    path = Path(path)
    tokenizer = char_tokenizer()
    extra = (
        ["<image>"]
        if arch == "llava"
        else ["<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"]
    )
    tokenizer.add_special_tokens({"additional_special_tokens": extra})
    tokenizer.chat_template = VLM_CHAT_TEMPLATE
    text = dict(
        model_type="llama",
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        **_special_ids(tokenizer),
    )
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    model, processor = (_tiny_llava if arch == "llava" else _tiny_idefics3)(
        tokenizer, text, vision, image_id, image_size, seed
    )
    processor.save_pretrained(str(path))
    return _save_tiny(model, tokenizer, path, arch, seed)


def _tiny_llava(tokenizer, text: dict, vision: dict, image_id: int, image_size: int | None, seed: int):
    import torch
    from transformers import CLIPImageProcessorPil, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    size, patch = image_size or 28, 14
    config = LlavaConfig(
        text_config=text,
        vision_config=dict(model_type="clip_vision_model", image_size=size, patch_size=patch, **vision),
        image_token_id=image_id,
        vision_feature_layer=-1,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    images = CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    processor = LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        chat_template=VLM_CHAT_TEMPLATE,
        patch_size=patch,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's class token
    )
    return model, processor


def _tiny_idefics3(tokenizer, text: dict, vision: dict, image_id: int, image_size: int | None, seed: int):
    """Idefics3 with one global image per picture (no splitting into tiles): (size / patch)^2 patches shuffled by
    ``scale_factor`` 2 into 4 image tokens between its marker tokens."""
    import torch
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
    )

    size, patch, scale = image_size or 32, 8, 2
    config = Idefics3Config(
        text_config=text,
        vision_config=dict(image_size=size, patch_size=patch, **vision),
        image_token_id=image_id,
        scale_factor=scale,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config)
    edge = {"longest_edge": size}
    images = Idefics3ImageProcessorPil(do_image_splitting=False, size=edge, max_image_size=edge)
    seq_len = (size // patch) ** 2 // scale**2
    processor = Idefics3Processor(
        image_processor=images, tokenizer=tokenizer, chat_template=VLM_CHAT_TEMPLATE, image_seq_len=seq_len
    )
    return model, processor


def build_tiny_model(
    path: str | Path,
    arch: str = "llama",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    seed: int = 0,
    tie_word_embeddings: bool | None = None,
    vocab_multiple: int = 1,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    max_positions: int = 1024,
) -> Path:
    """Write a random tiny causal LM of family ``arch`` (``ARCHITECTURES``) and its tokenizer to ``path``; returns
    the path. ``vocab_multiple`` rounds the embedding rows up (tensor parallelism splits the vocabulary evenly);
    ``head_dim`` sets the attention head size where the family lets it differ from hidden_size / num_heads;
    ``max_positions`` the longest sequence (prompt and response) it takes. GPT-2
    always ties its LM head to the embedding; the Gemma families tie it unless told otherwise."""
    import torch
    from transformers import AutoModelForCausalLM

    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {list(ARCHITECTURES)}, got {arch!r}")
    path = Path(path)
    tokenizer = char_tokenizer(path)
    shape = dict(
        vocab_size=-(-len(tokenizer) // vocab_multiple) * vocab_multiple,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        max_positions=max_positions,
        **_special_ids(tokenizer),
    )
    if arch == "gpt2":
        config = _gpt2_config(**shape)
    else:
        tied = arch in ("gemma2", "gemma3") if tie_word_embeddings is None else tie_word_embeddings
        config = _decoder_config(arch, tied, num_kv_heads, head_dim, **shape)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    return _save_tiny(model, tokenizer, path, arch, seed)


def _save_tiny(model, tokenizer, path: Path, arch: str, seed: int) -> Path:
    """Write ``model`` to ``path``, stopping at the tokenizer's end-of-sequence token and padding with its pad token,
    with the stamp that names its family and seed; returns the path."""
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(path))
    (path / "coati_tiny.json").write_text(json.dumps({"arch": arch, "seed": seed}))
    return path


def _gpt2_config(vocab_size, hidden_size, num_layers, num_heads, intermediate_size, max_positions, **special):
    import transformers

    return transformers.GPT2Config(
        vocab_size=vocab_size,
        n_embd=hidden_size,
        n_layer=num_layers,
        n_head=num_heads,
        n_positions=max_positions,
        n_inner=intermediate_size,
        **special,
    )


DECODER_CONFIGS = {
    "llama": "LlamaConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
    "mistral": "MistralConfig",
    "gemma2": "Gemma2Config",
    "gemma3": "Gemma3TextConfig",
    "phi3": "Phi3Config",
    "qwen3_moe": "Qwen3MoeConfig",
    "mixtral": "MixtralConfig",
    "olmoe": "OlmoeConfig",
    "qwen2_moe": "Qwen2MoeConfig",
}
"""the transformers config class of each decoder family but GPT-2"""


def _decoder_config(
    arch,
    tied,
    num_kv_heads,
    head_dim,
    vocab_size,
    hidden_size,
    num_layers,
    num_heads,
    intermediate_size,
    max_positions,
    **special,
):
    import transformers

    sized_heads = head_dim is not None or arch in (
        "qwen3",
        "gemma2",
        "gemma3",
        "llama",
        "mistral",
        "qwen3_moe",
        "mixtral",
    )
    return getattr(transformers, DECODER_CONFIGS[arch])(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tied,
        **({"head_dim": head_dim or hidden_size // num_heads} if sized_heads else {}),
        **(_experts(arch, intermediate_size or 2 * hidden_size) if arch in MOE_ARCHITECTURES else {}),
        **special,
    )


def _experts(arch: str, intermediate_size: int) -> dict:
    """8 experts, top-2, each expert's width ``intermediate_size``; the routed weights renormalised to sum to 1 as
    the family's released models do (Mixtral and Qwen3-MoE: yes; OLMoE and Qwen2-MoE: no)."""
    experts = {"num_experts_per_tok": 2, "output_router_logits": False}
    if arch == "mixtral":
        return {**experts, "num_local_experts": 8}
    experts |= {"num_experts": 8, "norm_topk_prob": arch == "qwen3_moe"}
    if arch in ("qwen3_moe", "qwen2_moe"):
        experts |= {"moe_intermediate_size": intermediate_size, "decoder_sparse_step": 1, "mlp_only_layers": []}
    if arch == "qwen2_moe":
        experts["shared_expert_intermediate_size"] = intermediate_size
    return experts


def build_tiny_reward_model(path: str | Path, hidden_size: int = 64, num_layers: int = 2, seed: int = 0) -> Path:
    """Write a random tiny Llama reward model (sequence classification, one output) and its tokenizer to ``path``."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    path = Path(path)
    tokenizer = char_tokenizer(path)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        num_labels=1,
        **_special_ids(tokenizer),
    )
    torch.manual_seed(seed)
    LlamaForSequenceClassification(config).save_pretrained(str(path))
    return path


def train_tiny_reward_model(
    path: str | Path,
    prompts: list,
    chosen: list[str],
    rejected: list[str],
    steps: int = 40,
    lr: float = 3e-3,
    seed: int = 0,
) -> Path:
    """Fit the reward model at ``path`` in place to score ``chosen[i]`` above ``rejected[i]`` for ``prompts[i]``
    (Bradley-Terry: minimise -log sigmoid(r_chosen - r_rejected), full batch, Adam); returns ``path``."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForSequenceClassification.from_pretrained(str(path), dtype=torch.float32)

    def render(prompt, answer):
        return tok.apply_chat_template(
            [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}], tokenize=False
        )

    good = tok(
        [render(p, c) for p, c in zip(prompts, chosen, strict=True)],
        return_tensors="pt",
        padding=True,
        add_special_tokens=False,
    )
    bad = tok(
        [render(p, r) for p, r in zip(prompts, rejected, strict=True)],
        return_tensors="pt",
        padding=True,
        add_special_tokens=False,
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        margin = model(**good).logits[:, 0] - model(**bad).logits[:, 0]
        loss = -torch.nn.functional.logsigmoid(margin).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(str(path))
    return Path(path)
