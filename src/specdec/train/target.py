"""The frozen target for training drafter heads: a plain batched torch forward on any device.

The inference Transformer (model/transformer.py) is written for CPU speculation (quantized
row-invariant matmuls, one sequence per cache slot); training wants big padded batches on
whatever device is there. Both run the one decoder layer of model/layers.py: here with dense
float weights (DecoderLayer modules, frozen) read from the same checkpoint, and attention over
a padded batch. Returns logits and the hidden states of chosen layers in transformers'
hidden_states indexing.

Every ModelConfig field the runtime computes with is computed here too (Gemma 3: embedding
scale, four norms per block, GeGLU, attention scale, sliding-window layers with their own RoPE
base, final logit softcap): a head trained against a different model than the one it drafts
for would look fine in training and accept nothing at inference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.model.layers import DecoderLayer, MaskedAttention, rms_norm, rope_rows, rope_tables, softcap


class DenseTarget:
    def __init__(self, source, device: str = "cpu", dtype: torch.dtype = torch.float32):
        """source: a checkpoint (GGUFModel / HFModel) with .config, .names(), .get(name)."""
        c = self.config = source.config
        self.device, self.dtype = device, dtype
        names = set(source.names())

        def get(name):
            return source.get(name).to(device=device, dtype=dtype)

        self.layers: list[DecoderLayer] = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            with torch.device("meta"):  # no random init: every tensor comes from the checkpoint
                layer = DecoderLayer(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                                     c.rms_norm_eps, qkv_bias=c.qkv_bias,
                                     qk_norm=c.qk_norm and p + "self_attn.q_norm.weight" in names,
                                     sandwich_norms=c.sandwich_norms, act=c.mlp_act)
            layer.load_state_dict({n: get(p + n) for n in layer.state_dict()}, assign=True)
            self.layers.append(layer.requires_grad_(False).eval())
        self.embed = get("model.embed_tokens.weight")
        self.norm = get("model.norm.weight")
        self.lm_head = self.embed if "lm_head.weight" not in names else get("lm_head.weight")
        cos, sin = rope_tables(c.head_dim, c.rope_theta, c.context_length, c.rope_freq_factors)
        self.cos, self.sin = cos.to(device, dtype), sin.to(device, dtype)
        self.local_cos, self.local_sin = self.cos, self.sin  # the sliding-window layers' tables
        if c.sliding_layers and c.rope_local_theta is not None:
            cos, sin = rope_tables(c.head_dim, c.rope_local_theta, c.context_length)
            self.local_cos, self.local_sin = cos.to(device, dtype), sin.to(device, dtype)

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.norm, self.config.rms_norm_eps)

    def logits(self, x: torch.Tensor, vocab: torch.Tensor | None = None) -> torch.Tensor:
        """x: (..., H) pre-norm hidden -> (..., V) float32 logits; over the ids `vocab` only, (..., len(vocab))."""
        W = self.lm_head if vocab is None else self.lm_head[vocab]
        return softcap(F.linear(self.final_norm(x), W).float(), self.config.final_logit_softcap)

    def embed_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """The first layer's input: embedding rows, times the model's embedding scale (in float32)."""
        x = self.embed[tokens]
        scale = self.config.embed_scale
        return x if scale == 1.0 else (x.float() * scale).to(x.dtype)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, valid: torch.Tensor | None = None, hidden_layers=(), cache=None,
                positions: torch.Tensor | None = None):
        """tokens: (B, T); valid: (B, T) bool (False = padding, never attended).

        Returns (logits (B, T, V) float32, {layer: (B, T, H)}). With `cache` (a list that this call
        extends with one {"k", "v", "valid"} per layer), the new tokens attend the cached ones too
        (generation)."""
        x, hidden = self._layers(tokens, valid, hidden_layers, cache, positions)
        return self.logits(x), hidden

    @torch.no_grad()
    def outputs(self, tokens: torch.Tensor, valid: torch.Tensor | None = None, hidden_layers=()) -> "TargetOutputs":
        """What the training losses read over a padded batch (TargetOutputs), without the (B, T, V) logits."""
        x, hidden = self._layers(tokens, valid, hidden_layers)
        return TargetOutputs(self, hidden, x, self.top_ids(x))

    @torch.no_grad()
    def top_ids(self, x: torch.Tensor, rows: int = 1024) -> torch.Tensor:
        """(..., H) pre-norm hidden -> (...) the id of each row's largest logit, `rows` rows of logits at a time."""
        flat = x.reshape(-1, x.shape[-1])
        top = [self.logits(flat[i : i + rows]).argmax(-1) for i in range(0, flat.shape[0], rows)]
        return torch.cat(top).view(x.shape[:-1]) if top else torch.zeros(x.shape[:-1], dtype=torch.long)

    def _layers(self, tokens, valid, hidden_layers, cache=None, positions=None):
        """forward's pass through the layers: (x (B, T, H) before the final norm, {layer: (B, T, H)})."""
        B, T = tokens.shape
        dev = self.device
        if valid is None:
            valid = torch.ones(B, T, dtype=torch.bool, device=dev)
        if positions is None:
            positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        cos, sin = rope_rows(self.cos, self.sin, positions)  # (B*T, 1, hd)
        c = self.config
        local_cos, local_sin = (cos, sin) if self.local_cos is self.cos else \
            rope_rows(self.local_cos, self.local_sin, positions)
        past_valid = cache[0]["valid"] if cache else torch.zeros(B, 0, dtype=torch.bool, device=dev)
        past_pos = cache[0]["pos"] if cache else torch.zeros(B, 0, dtype=torch.long, device=dev)
        key_valid = torch.cat([past_valid, valid], dim=1)  # (B, P + T)
        key_pos = torch.cat([past_pos, positions.to(dev)], dim=1)  # (B, P + T)
        P = past_valid.shape[1]
        causal = torch.ones(T, P + T, dtype=torch.bool, device=dev).tril(diagonal=P)
        mask = causal[None] & key_valid[:, None, :]  # (B, T, P + T)
        local_mask = None
        if c.sliding_layers:  # a local layer's query sees keys less than `window` positions back
            local_mask = mask & (positions.to(dev)[:, :, None] - key_pos[:, None, :] < c.sliding_window)
            local_mask = local_mask | ~local_mask.any(-1, keepdim=True)  # padded rows: see below
        mask = mask | ~mask.any(-1, keepdim=True)  # padded query rows attend anything (their output is unused)
        x = self.embed_rows(tokens)  # (B, T, H)
        hidden = {0: x} if 0 in hidden_layers else {}
        x = x.reshape(B * T, -1)
        fresh = not cache  # the first call of a generation fills the cache; later ones extend it
        for li, layer in enumerate(self.layers):
            past_k, past_v = (None, None) if fresh else (cache[li]["k"], cache[li]["v"])
            local = li in c.sliding_layers
            attend = MaskedAttention(B, past_k, past_v, local_mask if local else mask, c.attn_scale)
            x = layer(x, attend, local_cos if local else cos, local_sin if local else sin)  # (B*T, H)
            if cache is not None:
                entry = {"k": attend.keys, "v": attend.values, "valid": key_valid, "pos": key_pos}  # (B, nkv, P+T, hd)
                if fresh:
                    cache.append(entry)
                else:
                    cache[li] = entry
            if li + 1 in hidden_layers:
                hidden[li + 1] = x.reshape(B, T, -1)
        return x.reshape(B, T, -1), hidden

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new: int, temperature: float, eos: set[int],
                 generator: torch.Generator) -> list[list[int]]:
        """Sample continuations of left-padded prompts; returns prompt + continuation per row (EOS excluded)."""
        B = len(prompts)
        width = max(len(p) for p in prompts)
        tokens = torch.zeros(B, width, dtype=torch.long)
        valid = torch.zeros(B, width, dtype=torch.bool)
        for b, p in enumerate(prompts):
            tokens[b, width - len(p):] = torch.tensor(p)
            valid[b, width - len(p):] = True
        tokens, valid = tokens.to(self.device), valid.to(self.device)
        cache: list = []
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        logits, _ = self.forward(tokens, valid, cache=cache, positions=positions)
        nxt_pos = positions[:, -1:] + 1
        out = [list(p) for p in prompts]
        # sample on the device and bring back only the ids (moving (B, V) rows to the host is slow)
        device_gen = torch.Generator(device=self.device)
        device_gen.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
        steps = []
        last = logits[:, -1]
        for _ in range(max_new):
            if temperature > 0:
                nxt = torch.multinomial(torch.softmax(last / temperature, -1), 1, generator=device_gen)[:, 0]
            else:
                nxt = last.argmax(-1)
            steps.append(nxt)
            logits, _ = self.forward(nxt[:, None], torch.ones(B, 1, dtype=torch.bool, device=self.device),
                                     cache=cache, positions=nxt_pos)
            nxt_pos = nxt_pos + 1
            last = logits[:, -1]
        new = torch.stack(steps, dim=1).tolist() if steps else [[] for _ in range(B)]  # (B, max_new)
        for b in range(B):
            for t in new[b]:
                if t in eos:
                    break
                out[b].append(t)
        return out


class TargetOutputs:
    """The frozen target over a padded batch, as the training losses read it: `hidden` {layer: (B, T, H)},
    `last` (B, T, H) the final hidden state before the norm, `top` (B, T) the id of the largest logit at each
    position (over the whole vocabulary); logits() computes only the rows and the vocabulary a loss asks for."""

    def __init__(self, target: DenseTarget, hidden: dict, last: torch.Tensor, top: torch.Tensor):
        self.target, self.hidden, self.last, self.top = target, hidden, last, top

    def logits(self, vocab: torch.Tensor | None = None, rows: torch.Tensor | None = None) -> torch.Tensor:
        """float32 logits over `vocab` (ids; default all) at every position, or at `rows` (B, R) positions of
        each sequence: (B, T or R, V or len(vocab))."""
        x = self.last if rows is None else self.last.gather(1, rows[..., None].expand(-1, -1, self.last.shape[-1]))
        return self.target.logits(x, vocab)
