"""The frozen target for training drafter heads: a plain batched torch forward on any device.

The inference Transformer (model/transformer.py) is written for CPU speculation (quantized
row-invariant matmuls, one sequence per cache slot); training wants big padded batches on
whatever device is there. This is the same math (Llama / Qwen2 / Qwen3) in dense float
weights, read from the same checkpoint, returning logits and the hidden states of chosen
layers in transformers' hidden_states indexing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.model.transformer import rope_tables


class DenseTarget:
    def __init__(self, source, device: str = "cpu", dtype: torch.dtype = torch.float32):
        """source: a checkpoint (GGUFModel / HFModel) with .config, .names(), .get(name)."""
        c = self.config = source.config
        self.device, self.dtype = device, dtype
        names = set(source.names())

        def get(name):
            return source.get(name).to(device=device, dtype=dtype)

        self.layers = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            layer = {k: get(p + n) for k, n in (
                ("q", "self_attn.q_proj.weight"), ("k", "self_attn.k_proj.weight"), ("v", "self_attn.v_proj.weight"),
                ("o", "self_attn.o_proj.weight"), ("gate", "mlp.gate_proj.weight"), ("up", "mlp.up_proj.weight"),
                ("down", "mlp.down_proj.weight"), ("attn_norm", "input_layernorm.weight"),
                ("mlp_norm", "post_attention_layernorm.weight"))}
            for k, n in (("qb", "self_attn.q_proj.bias"), ("kb", "self_attn.k_proj.bias"), ("vb", "self_attn.v_proj.bias"),
                         ("q_norm", "self_attn.q_norm.weight"), ("k_norm", "self_attn.k_norm.weight")):
                layer[k] = get(p + n) if p + n in names else None
            self.layers.append(layer)
        self.embed = get("model.embed_tokens.weight")
        self.norm = get("model.norm.weight")
        self.lm_head = self.embed if "lm_head.weight" not in names else get("lm_head.weight")
        cos, sin = rope_tables(c.head_dim, c.rope_theta, c.context_length)
        self.cos, self.sin = cos.to(device, dtype), sin.to(device, dtype)

    def _norm(self, x, w):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)).to(x.dtype) * w

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return self._norm(x, self.norm)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., H) pre-norm hidden -> (..., V) float32 logits."""
        return F.linear(self.final_norm(x), self.lm_head).float()

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, valid: torch.Tensor | None = None, hidden_layers=(), cache=None,
                positions: torch.Tensor | None = None):
        """tokens: (B, T); valid: (B, T) bool (False = padding, never attended).

        Returns (logits (B, T, V) float32, {layer: (B, T, H)}). With `cache` (a list that this call
        extends), the new tokens attend the cached ones too (generation)."""
        c = self.config
        B, T = tokens.shape
        dev = self.device
        if valid is None:
            valid = torch.ones(B, T, dtype=torch.bool, device=dev)
        if positions is None:
            positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        cos = self.cos[positions][:, None]  # (B, 1, T, hd)
        sin = self.sin[positions][:, None]
        past_valid = cache[0]["valid"] if cache else torch.zeros(B, 0, dtype=torch.bool, device=dev)
        key_valid = torch.cat([past_valid, valid], dim=1)  # (B, P + T)
        P = past_valid.shape[1]
        causal = torch.ones(T, P + T, dtype=torch.bool, device=dev).tril(diagonal=P)
        mask = (causal[None] & key_valid[:, None, :])[:, None]  # (B, 1, T, P + T)
        mask = mask | ~mask.any(-1, keepdim=True)  # padded query rows attend anything (their output is unused)
        x = self.embed[tokens]
        hidden = {0: x} if 0 in hidden_layers else {}
        half = c.head_dim // 2

        def rot(t):
            return t * cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * sin

        for li, L in enumerate(self.layers):
            h = self._norm(x, L["attn_norm"])
            q = F.linear(h, L["q"], L["qb"]).view(B, T, c.num_heads, c.head_dim).transpose(1, 2)
            k = F.linear(h, L["k"], L["kb"]).view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)
            v = F.linear(h, L["v"], L["vb"]).view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)
            if L["q_norm"] is not None:
                q, k = self._norm(q, L["q_norm"]), self._norm(k, L["k_norm"])
            q, k = rot(q), rot(k)
            if cache is not None:
                if len(cache) <= li:
                    cache.append({"k": k, "v": v, "valid": key_valid})
                else:
                    cache[li]["k"] = k = torch.cat([cache[li]["k"], k], dim=2)
                    cache[li]["v"] = v = torch.cat([cache[li]["v"], v], dim=2)
                    cache[li]["valid"] = key_valid
            group = c.num_heads // c.num_kv_heads
            kk, vv = (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)) if group > 1 else (k, v)
            att = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)
            x = x + F.linear(att.transpose(1, 2).reshape(B, T, -1), L["o"])
            h = self._norm(x, L["mlp_norm"])
            x = x + F.linear(F.silu(F.linear(h, L["gate"])) * F.linear(h, L["up"]), L["down"])
            if li + 1 in hidden_layers:
                hidden[li + 1] = x
        return self.logits(x), hidden

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
