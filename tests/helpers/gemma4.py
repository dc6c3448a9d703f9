"""Tiny Gemma 4 checkpoints written by the reference's own code (transformers' Gemma4 classes, random weights,
save_pretrained): the text model (Gemma4ForCausalLM, model_type gemma4_text) and its MTP drafter
(Gemma4AssistantForCausalLM, model_type gemma4_assistant).

The text model uses every feature the dense family has: sliding and global layers with their own head widths,
key/value head counts and RoPE (the global layers' "proportional" RoPE rotating a quarter of each head), values
equal to keys on the global layers (attention_k_eq_v), the last layers reading the keys and values of earlier
ones (num_kv_shared_layers) with a double-wide MLP, per-layer inputs (PLE), the layer scalar, and final logit
soft-capping. FIXTURE (tests/model/data/gemma4-tiny) holds both folders, made by its make_fixture.py.
"""

from __future__ import annotations

from pathlib import Path

import torch

from helpers.tiny import write_tokenizer_json

FIXTURE = Path(__file__).resolve().parent.parent / "model" / "data" / "gemma4-tiny"

# 6 layers: sliding, sliding, global, sliding, sliding, global; the last 2 read the keys and values of layers 3
# (sliding) and 2 (global). Sliding heads 16 wide (2 kv heads), global heads 32 wide (1 kv head, values = keys)
TEXT = dict(vocab_size=272, hidden_size=32, intermediate_size=48, num_hidden_layers=6, num_attention_heads=2,
            num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
            attention_k_eq_v=True, num_kv_shared_layers=2, use_double_wide_mlp=True,
            hidden_size_per_layer_input=8, vocab_size_per_layer_input=272, sliding_window=4,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
            final_logit_softcapping=30.0, max_position_embeddings=512, rms_norm_eps=1e-6,
            bos_token_id=None, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True,
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                "rope_theta": 1000000.0}})
# the assistant: 2 layers (sliding, global) of width 24 over the target's width 32, reading the target's keys
ASSISTANT_TEXT = dict(TEXT, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                      layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=2,
                      use_double_wide_mlp=False, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0)


def _randomize(model, seed: int) -> None:
    """Every parameter random: RMS norm weights near 1 (Gemma 4 multiplies by w itself), the layer scalars near 1,
    matrices small, the embeddings larger."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * noise)
            else:
                p.copy_(noise * (0.5 if "embed" in name else 0.15))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(1 + 0.2 * torch.rand(b.shape, generator=g))


def text_folder(folder, seed: int = 0, **text) -> Path:
    """A tiny Gemma 4 text folder written by transformers (Gemma4ForCausalLM)."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    folder = Path(folder)
    model = Gemma4ForCausalLM(Gemma4TextConfig(**{**TEXT, **text}))
    _randomize(model, seed)
    model.save_pretrained(folder)
    write_tokenizer_json(folder, model.config.vocab_size)
    return folder


def assistant_folder(folder, seed: int = 1, centroids: int = 0, **text) -> Path:
    """A tiny gemma4_assistant folder written by transformers; centroids > 0: the centroid-clustered head
    (use_ordered_embeddings) with that many clusters of the vocabulary, a random token order."""
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    folder = Path(folder)
    cfg = Gemma4AssistantConfig(text_config={**ASSISTANT_TEXT, **text}, backbone_hidden_size=TEXT["hidden_size"],
                                use_ordered_embeddings=bool(centroids), num_centroids=centroids or 2048,
                                centroid_intermediate_top_k=2)
    model = Gemma4AssistantForCausalLM(cfg)
    _randomize(model, seed)
    if centroids:
        g = torch.Generator().manual_seed(seed + 7)
        model.masked_embedding.token_ordering.copy_(torch.randperm(cfg.text_config.vocab_size, generator=g))
    model.save_pretrained(folder)
    return folder


def echo_assistant_folder(folder, target_folder=FIXTURE / "hf") -> Path:
    """An assistant (written by transformers) that drafts the target's own last prediction again and again: it
    reads the target's hidden state alone (pre_projection [0 | I]), its layers add nothing (o_proj and down_proj
    zero), and its head is the target's embedding. Against a target that repeats a token, its drafts are
    accepted, which a random assistant's never are."""
    from safetensors.torch import load_file
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    H = TEXT["hidden_size"]
    cfg = Gemma4AssistantConfig(text_config={**ASSISTANT_TEXT, "hidden_size": H}, backbone_hidden_size=H)
    model = Gemma4AssistantForCausalLM(cfg)
    _randomize(model, 9)
    target = load_file(str(Path(target_folder) / "model.safetensors"))
    with torch.no_grad():
        model.pre_projection.weight.copy_(torch.cat([torch.zeros(H, H), torch.eye(H)], dim=1))
        model.post_projection.weight.copy_(torch.eye(H))
        model.model.norm.weight.fill_(1.0)
        model.model.embed_tokens.weight.copy_(target["model.embed_tokens.weight"])
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
            layer.layer_scalar.fill_(1.0)
    model.save_pretrained(folder)
    return Path(folder)


# towers as small as transformers' Gemma4 classes take: only their presence in the folder matters here
VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
              head_dim=8, patch_size=4, position_embedding_size=16)
AUDIO = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, subsampling_conv_channels=[4, 4],
             output_proj_dims=16, conv_kernel_size=3)


def published_folder(folder, seed: int = 2):
    """A tiny multimodal Gemma 4 folder as Google publishes them (Gemma4ForConditionalGeneration, model_type gemma4:
    the text model under model.language_model.*, vision and audio towers beside it); returns (folder, model)."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    folder = Path(folder)
    model = Gemma4ForConditionalGeneration(Gemma4Config(text_config=TEXT, vision_config=VISION, audio_config=AUDIO))
    _randomize(model, seed)
    model.save_pretrained(folder)
    write_tokenizer_json(folder, TEXT["vocab_size"])
    return folder, model.eval()
