"""A block drafter's folder: config.json + *.safetensors, read (checked against the target) and written.

Files (Hugging Face layout; tensor names as published, read and written by load/save below):
  config.json  dflash: Qwen3 sizes (hidden_size = the target's; num_hidden_layers = the drafter's),
               dflash_config {target_layer_ids, mask_token_id[, block_size]}, block_size at the top level
               or in dflash_config, num_target_layers. dspark: the same sizes; target_layer_ids,
               mask_token_id, block_size, num_anchors, markov_rank, markov_head_type,
               enable_confidence_head, confidence_head_with_markov at the top level.
  *.safetensors  fc.weight (H, k*H), hidden_norm.weight, norm.weight,
               layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.self_attn.{q,k}_norm.weight,
               layers.{i}.mlp.{gate,up,down}_proj.weight, layers.{i}.{input,post_attention}_layernorm.weight;
               dspark adds markov_head.markov_w1.weight (V, r), markov_head.markov_w2.weight (V, r)
               [gated: markov_head.gate_proj.*; rnn: markov_head.joint_proj.*], confidence_head.proj.{weight,bias},
               and embed_tokens.weight / lm_head.weight: frozen copies of the target's, checked for
               their vocabulary and otherwise unused (the target's own are used).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdec.drafters.block.config import MAX_VOCAB_PADDING, BlockConfig, DFlashError, fit_problem
from specdec.drafters.block.model import BlockDraftModel, TargetParts
from specdec.model.errors import ModelFileError
from specdec.model.files import read_json_object, replaced, safetensors_header, write_text

_SKIPPED = ("embed_tokens.weight", "lm_head.weight")  # DSpark's frozen copies of the target's


def read_config(path) -> BlockConfig:
    """The BlockConfig of a drafter folder (config.json only)."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise DFlashError(f"{path}: not a DFlash/DSpark drafter folder (no config.json)")
    try:
        raw = read_json_object(cfg_file)
    except ModelFileError as exc:
        raise DFlashError(str(exc)) from None
    return BlockConfig.from_json(raw, f"drafter {path}")


def load_block_drafter(path, target: TargetParts, target_config, target_name: str = "the target",
                       max_positions: int = 4096) -> BlockDraftModel:
    """A BlockDraftModel from a folder (config.json + *.safetensors), checked against the target."""
    path = Path(path)
    cfg = read_config(path)
    problem = fit_problem(cfg, target_config, target_name, f"drafter {path}", target.embed.shape[0])
    if problem:
        raise DFlashError(problem)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise DFlashError(f"{path}: no .safetensors weights (pickled .bin files are never loaded; convert them)")
    model = BlockDraftModel(cfg, target, max_positions)
    own = {k: v for k, v in model.state_dict().items()}
    state = {}
    for f in files:
        try:
            header = safetensors_header(f)
        except ModelFileError as exc:
            raise DFlashError(str(exc)) from None
        for name, (_, shape) in header.items():
            key = name.removeprefix("model.")
            if key in _SKIPPED:
                if abs(shape[0] - target_config.vocab_size) > MAX_VOCAB_PADDING:
                    raise DFlashError(f"drafter {path}: {key} has {shape[0]} rows; {target_name} has a vocabulary of "
                                      f"{target_config.vocab_size}: it belongs to another model")
            elif key in own and tuple(own[key].shape) != shape:
                raise DFlashError(f"drafter {path}: tensor {name} has shape {shape}, expected "
                                  f"{tuple(own[key].shape)} from its config.json")
        try:
            with safe_open(str(f), framework="pt") as fh:
                state.update({name.removeprefix("model."): fh.get_tensor(name).float() for name in header
                              if name.removeprefix("model.") not in _SKIPPED})
        except Exception as exc:  # safetensors' own error type: data cut short after a whole header
            raise DFlashError(f"{f}: not a readable safetensors file ({exc})") from None
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise DFlashError(f"drafter {path}: missing tensors {sorted(missing)}, unexpected {sorted(unexpected)}")
    return model.eval()


def save_block_drafter(model: BlockDraftModel, folder, target_info: dict | None = None,
                       dtype: torch.dtype = torch.bfloat16, embed_tokens: torch.Tensor | None = None,
                       lm_head: torch.Tensor | None = None) -> Path:
    """Write config.json + model.safetensors in the model's published layout.

    embed_tokens / lm_head: (V, H) target weights that a DSpark folder carries (DeepSpec's loader expects
    them); DFlash folders never do."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    if model.cfg.layout == "dspark":
        for key, t in (("embed_tokens.weight", embed_tokens), ("lm_head.weight", lm_head)):
            if t is not None:
                tensors[key] = t.detach().to("cpu", dtype).contiguous()
    with replaced(folder / "model.safetensors") as tmp:  # a run killed here keeps the previous drafter whole
        save_file(tensors, str(tmp))
    raw = model.cfg.to_json()
    if target_info:
        raw["specdec"] = {"kind": model.cfg.layout, "target": target_info}
    write_text(folder / "config.json", json.dumps(raw, indent=2) + "\n")
    return folder
