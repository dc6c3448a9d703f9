"""Gemma 4's MTP drafter, shipped as a separate assistant checkpoint (transformers' gemma4_assistant), run
as draft-mtp for a Gemma 4 target (model/gemma4.py).

The assistant keeps no keys of its own: each of its layers attends over the keys and values of the target's
last KV-owning layer of the same kind (sliding or global), as the target computed them for the committed
tokens. Every draft step runs at the position of the newest token m (a constant through a draft):

    x     = pre_projection([embed_target(t) * sqrt(H_target); h])    t: the token, h: the target's normed
                                                                      last hidden row, then the step's own
    x     = x + post_attention_norm(o(attend(rope(q_norm(q(n(x)))), K, V)))    over all committed keys (global
            x + post_feedforward_norm(mlp(pre_feedforward_norm(x)))             layers) or the last window + 1
            x * layer_scalar                                                     of them (sliding layers)
    y     = norm(x);  h' = post_projection(y)
    logits= y . lm_head rows;  with use_ordered_embeddings (the centroid-clustered head): only the tokens of the
            top-k of `num_centroids` clusters (centroids(y)), the others set to the least of those minus 1

as transformers' Gemma4AssistantForCausalLM and its candidate generator compute it. The target's keys and
values are recomputed here from its hidden rows (hidden_layers: the inputs of those two layers, and its last)
with the target's own weights, so the drafter needs nothing but the engine's on_target_hidden.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from specdec.drafters.base import DEFAULT_DRAFT_LENGTH, Draft, DrafterBase
from specdec.drafters.tree import grow_tree
from specdec.model.checkpoint_facts import ASSISTANT_TYPE, assistant_beside, is_assistant_folder
from specdec.model.errors import SpecdecError
from specdec.model.files import read_json_object
from specdec.model.gemma4_checkpoint import gemma4_config
from specdec.model.layers import RopeTable, apply_rope, mlp_act, rms_norm
from specdec.sampling import SamplingParams, process_logits, sample_token


class AssistantError(SpecdecError):
    pass


def assistant_mismatch(raw: dict, target_config, target_name, folder) -> str | None:
    """Why the assistant whose config.json is `raw` cannot draft for this target, or None."""
    if target_config is None:
        return None
    if getattr(target_config, "gemma4", None) is None:
        return f"{folder} is a Gemma 4 assistant; the target {target_name} is not a Gemma 4 model"
    text = raw.get("text_config") or {}
    for what, have, want in (("backbone_hidden_size", raw.get("backbone_hidden_size"), target_config.hidden_size),
                             ("vocab_size", text.get("vocab_size"), target_config.vocab_size)):
        if have != want:
            return f"the assistant {folder} has {what} {have!r}; the target {target_name} has {want}"
    return None


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors files, floats as float32 (token_ordering stays integer)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise AssistantError(f"the assistant {folder} has no .safetensors weights")
    out = {}
    for file in files:
        for name, t in load_file(str(file)).items():
            out[name] = t.float() if t.is_floating_point() else t
    return out


class Gemma4Assistant:
    """The assistant's weights (float32) and config, read from its folder (config.json + safetensors)."""

    def __init__(self, folder, target):
        folder = Path(folder)
        raw = read_json_object(folder / "config.json")
        text = dict(raw.get("text_config") or {})
        problem = assistant_mismatch(raw, target.config, target.info.name, folder)
        if problem is not None:
            raise AssistantError(problem)
        for key in ("hidden_size_per_layer_input", "enable_moe_block", "use_double_wide_mlp"):
            if text.get(key):
                raise AssistantError(f"the assistant {folder} sets {key}; a Gemma 4 assistant has none")
        # its layers' geometry as the text model's (their keys are the target's: no KV sharing to resolve)
        self.config = gemma4_config(folder, {**text, "num_kv_shared_layers": 0, "tie_word_embeddings": True}, True)
        self.ordered = bool(raw.get("use_ordered_embeddings"))
        self.top_k, self.centroids_n = int(raw.get("centroid_intermediate_top_k", 32)), int(raw.get("num_centroids", 2048))
        self.t = _tensors(folder)
        c, tc = self.config, target.config
        for kind, (nkv, hd) in ((False, (c.num_kv_heads, c.head_dim)),
                                (True, (c.gemma4.global_kv_heads, c.gemma4.global_head_dim))):
            if not any((li not in c.sliding_layers) == kind for li in range(c.num_layers)):
                continue
            have = (tc.gemma4.global_kv_heads, tc.gemma4.global_head_dim) if kind else (tc.num_kv_heads, tc.head_dim)
            if have != (nkv, hd):
                raise AssistantError(f"the assistant {folder}'s {'global' if kind else 'sliding'} layers read "
                                     f"{nkv} key heads of {hd}; the target {target.info.name} has {have[0]} of {have[1]}")
        if self.ordered and c.vocab_size % self.centroids_n:
            raise AssistantError(f"the assistant {folder} clusters {c.vocab_size} tokens into {self.centroids_n} "
                                 "centroids: not a whole number per centroid")
        self.lm_head = self.t.get("lm_head.weight", self.t["model.embed_tokens.weight"])
        self.ropes = {True: RopeTable(c.gemma4.global_head_dim, c.rope_theta, c.context_length,
                                      c.gemma4.global_rope_factors()),
                      False: RopeTable(c.head_dim, c.rope_local_theta, c.context_length)}

    def step(self, x_in: torch.Tensor, position: int, kv: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """x_in (n, 2 * H_target) -> (logits (n, V), h' (n, H_target)); kv: {global?: (K, V) (nkv, L, hd)}."""
        c, t, eps = self.config, self.t, self.config.rms_norm_eps
        x = F.linear(x_in, t["pre_projection.weight"])
        n, nh = x.shape[0], c.num_heads
        pos = torch.full((1, n), position)
        for li in range(c.num_layers):
            p, kind = f"model.layers.{li}.", li not in c.sliding_layers
            hd = c.gemma4.global_head_dim if kind else c.head_dim
            h = rms_norm(x, t[p + "input_layernorm.weight"], eps)
            q = rms_norm(F.linear(h, t[p + "self_attn.q_proj.weight"]).reshape(n, nh, hd),
                         t[p + "self_attn.q_norm.weight"], eps)
            q = apply_rope(q, *self.ropes[kind].rows(pos))
            keys, values = kv[kind]
            if not kind:  # transformers' bidirectional window, flipped to look back: the last window + 1 keys
                keys, values = keys[:, -(c.sliding_window + 1):], values[:, -(c.sliding_window + 1):]
            group = nh // keys.shape[0]
            scores = torch.einsum("nhd,hld->nhl", q, keys.repeat_interleave(group, 0))  # scale 1
            attn = torch.einsum("nhl,hld->nhd", torch.softmax(scores, -1), values.repeat_interleave(group, 0))
            out = F.linear(attn.reshape(n, nh * hd), t[p + "self_attn.o_proj.weight"])
            x = x + rms_norm(out, t[p + "post_attention_layernorm.weight"], eps)
            h = rms_norm(x, t[p + "pre_feedforward_layernorm.weight"], eps)
            gate, up = F.linear(h, t[p + "mlp.gate_proj.weight"]), F.linear(h, t[p + "mlp.up_proj.weight"])
            out = F.linear(mlp_act(gate, up, c.mlp_act, t[p + "pre_feedforward_layernorm.weight"]),
                           t[p + "mlp.down_proj.weight"])
            x = (x + rms_norm(out, t[p + "post_feedforward_layernorm.weight"], eps)) * t[p + "layer_scalar"]
        y = rms_norm(x, t["model.norm.weight"], eps)
        return self.logits(y), F.linear(y, t["post_projection.weight"])

    def logits(self, y: torch.Tensor) -> torch.Tensor:
        """(n, H) -> (n, V): the full head, or the centroid-clustered one (module docstring)."""
        if not self.ordered:
            return F.linear(y, self.lm_head)
        t, V = self.t, self.config.vocab_size
        top = torch.topk(F.linear(y, t["masked_embedding.centroids.weight"]), self.top_k, dim=-1).indices
        members = t["masked_embedding.token_ordering"].long().view(self.centroids_n, V // self.centroids_n)
        picked = members[top].reshape(y.shape[0], -1)  # (n, top_k * V / C) token ids
        chosen = torch.einsum("nh,nkh->nk", y, self.lm_head[picked])
        out = chosen.min(dim=-1, keepdim=True).values.expand(-1, V) - 1.0  # transformers' mask value, per row
        return out.clone().scatter_(-1, picked, chosen)


class Gemma4AssistantDrafter(DrafterBase):
    """draft-mtp for a Gemma 4 target with its assistant: chains, or trees (topk > 1) grown by tree.grow_tree."""

    name = "draft-mtp"

    def __init__(self, target, assistant: Gemma4Assistant, topk: int = 1, budget: int = DEFAULT_DRAFT_LENGTH,
                 p_min: float = 0.0, max_len: int = 4096):
        tr = target.transformer
        self.tr, self.assistant = tr, assistant
        self.topk, self.budget, self.p_min, self.max_len = topk, budget, p_min, max_len
        g, L = tr.config.gemma4, tr.config.num_layers
        # the target's last KV-owning layer of each kind: the keys its assistant reads
        self.store = {kind: max(li for li in range(L) if g.owns_kv(li) and tr.is_global[li] == kind)
                      for kind in (False, True) if any(tr.is_global[li] == kind for li in range(L))}
        self.hidden_layers = tuple(sorted({*self.store.values(), L}))
        self.begin([])

    def begin(self, prompt: Sequence[int], sampling: SamplingParams = SamplingParams(),
              generator: torch.Generator | None = None) -> None:
        self.sampling, self.generator = sampling, generator or torch.Generator()
        self.kv = {kind: ([], []) for kind in self.store}  # kind -> (key rows, value rows), (nkv, n, hd) each
        self.fed, self.last = 0, None  # committed tokens; the target's normed hidden row of the last one

    @torch.inference_mode()
    def on_target_hidden(self, hidden: dict[int, torch.Tensor], tokens: Sequence[int]) -> None:
        tr, c = self.tr, self.tr.config
        n = len(tokens)
        positions = torch.arange(self.fed, self.fed + n)[None]
        for kind, li in self.store.items():
            layer, (nkv, hd) = tr.layers[li], tr.geometry(li)
            h = rms_norm(hidden[li].float(), layer.attn_norm, c.rms_norm_eps)
            qkv = layer.qkv(h, True)
            nq = c.num_heads * hd
            k = qkv[:, nq : nq + nkv * hd].reshape(n, nkv, hd)
            v = k if qkv.shape[1] == nq + nkv * hd else qkv[:, nq + nkv * hd :].reshape(n, nkv, hd)
            v = rms_norm(v, torch.ones(hd), c.rms_norm_eps)
            k = apply_rope(rms_norm(k, layer.k_norm, c.rms_norm_eps), *(tr.rope if kind else tr.local_rope).rows(positions))
            self.kv[kind][0].append(k.transpose(0, 1))
            self.kv[kind][1].append(v.transpose(0, 1))
        self.last = rms_norm(hidden[c.num_layers][-1:].float(), tr.norm, c.rms_norm_eps)  # (1, H)
        self.fed += n

    @torch.inference_mode()
    def propose(self, context: Sequence[int], draft_length: int) -> Draft:
        m = self.fed
        if draft_length <= 0 or m == 0 or len(context) != m + 1:
            return Draft()
        kv = {}
        for kind, (ks, vs) in self.kv.items():
            if len(ks) > 1:  # joined once per new commit
                self.kv[kind] = ([torch.cat(ks, 1)], [torch.cat(vs, 1)])
            kv[kind] = self.kv[kind][0][0], self.kv[kind][1][0]

        def run(tokens: list[int], feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x = torch.cat([self.tr.embed_rows(torch.tensor(tokens)), feats], dim=-1)
            return self.assistant.step(x, m, kv)

        logits, feat = run([int(context[m])], self.last)
        if self.topk > 1:
            def expand(nodes, tokens, parents, parent_feats, depth, node_slots):
                return run(list(tokens), parent_feats)

            return grow_tree(logits[0], feat[0], expand, max_depth=draft_length, topk=self.topk,
                             budget=self.budget, sampling=self.sampling, generator=self.generator,
                             process=lambda row: process_logits(row, self.sampling), p_min=self.p_min)
        tokens, probs = [], []
        for i in range(draft_length):
            if self.sampling.greedy:
                if self.p_min > 0 and float(torch.softmax(logits[0], -1).max()) < self.p_min:
                    break
                token = int(logits[0].argmax())
            else:
                row = process_logits(logits[0], self.sampling)
                if self.p_min > 0 and float(row.max()) < self.p_min:
                    break
                token = sample_token(row, self.generator)
                probs.append(row)
            tokens.append(token)
            if i + 1 < draft_length:
                logits, feat = run([token], feat)
        return Draft.chain(tokens, torch.stack(probs) if probs else None)


def make_assistant_drafter(model, folder=None, p_min: float = 0.0, max_len: int = 4096, topk: int = 1,
                           budget: int = DEFAULT_DRAFT_LENGTH) -> Gemma4AssistantDrafter:
    """draft-mtp for a Gemma 4 target: its assistant from `folder` (-md), else the one beside the model."""
    found = Path(folder) if folder is not None else assistant_beside(model.info.path)
    if found is None:
        raise AssistantError(f"{model.info.name} is a Gemma 4 model: its MTP drafter is a separate assistant "
                             "checkpoint (gemma4_assistant); give its folder with -md, or put it beside the model "
                             f"as {Path(model.info.path).name}-assistant")
    if not is_assistant_folder(found):
        raise AssistantError(f"{found} is not a Gemma 4 assistant folder (config.json with model_type "
                             f"{ASSISTANT_TYPE}), which draft-mtp reads for a Gemma 4 target")
    drafter = Gemma4AssistantDrafter(model, Gemma4Assistant(found, model), topk, budget, p_min, max_len)
    drafter.source_note = f"Gemma 4 assistant {found}"
    return drafter


__all__ = ["AssistantError", "Gemma4Assistant", "Gemma4AssistantDrafter", "assistant_beside", "is_assistant_folder",
           "make_assistant_drafter"]
