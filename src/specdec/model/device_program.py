"""The device runtime's fixed-shape programs (model/device.py): one exact forward of `rows` query rows over
one cache slot, its cache (DeviceKVCache: `width` key positions a slot, a spare one for padding rows)
and the masks of which cache positions each row attends.

    segment of T rows at cache offset start      one program call per `rows` of them
    rows t < T: tokens, positions, writes        K/V written at start + t, then attention
    rows t >= T: padding                         token 0 at position 0, writes the spare position
                                                 width - 1, sees only that key
    mask (rows, width) per window, made in the   [r, j]: row r attends cache position j (a chain's
    program from the write offsets               row: j <= its offset, inside its window)

On CUDA each (cache, slot, hidden layers) program is captured once as a CUDA graph and replayed,
with the inputs copied into its fixed buffers; elsewhere (CPU, for the tests) it runs eagerly, the
same ops.
"""

from __future__ import annotations

from functools import partial

import torch

from specdec.cache.kv import KVCache
from specdec.model.cache_attention import tree_row_keys
from specdec.model.config import ModelConfig

# The programs' key width is a multiple of this, so that the attention's products have aligned rows: cuBLAS
# runs unaligned ones on old, slow kernels (the odd width max_len + 1: 3.3 ms of a 13 ms Llama-3-8B step on
# an H200 in p·V alone; 0.4 ms for both products aligned).
KEY_ALIGN = 256


class DeviceKVCache(KVCache):
    """The KV cache on the device: `width` positions per slot, max_len and spare ones up to a multiple of
    KEY_ALIGN, the last of which padded rows write (spare_position); every position zero-filled (the
    programs read them all, masked; a masked key must still be finite); and the captured programs that
    use this buffer, which live as long as it does."""

    def __init__(self, config: ModelConfig, max_len: int, num_slots: int, dtype: torch.dtype, device: torch.device):
        self.width = -(-(max_len + 1) // KEY_ALIGN) * KEY_ALIGN
        self.spare_position = self.width - 1
        super().__init__(config.num_layers, config.num_kv_heads, config.head_dim, max_len, num_slots, dtype, device,
                         spare=self.width - max_len)
        self.programs: dict[tuple[int, tuple[int, ...]], Program] = {}  # (slot, hidden layers) -> program


class Program:
    """One exact forward of fixed shape over one cache slot: `rows` rows in, logits (rows, V) and the
    asked-for hidden states out, all in fixed buffers. On CUDA a captured graph, else run eagerly."""

    def __init__(self, model, cache: DeviceKVCache, slot: int, hidden_layers: tuple[int, ...]):
        # model: the DeviceTransformer whose _exact_program this runs (not imported: device.py imports this module)
        rows, device = model.rows, model.device
        # the inputs, tokens, positions and write offsets, in one buffer filled by one copy from a host
        # buffer (pinned on CUDA, so that the copy does not stage through another); until filled, padding
        pinned = device.type == "cuda"
        self.spare = cache.spare_position
        self.ids = torch.zeros(3, rows, dtype=torch.long, device=device)
        self.ids[2] = self.spare
        self.tokens, self.positions, self.writes = self.ids
        self.host_ids = torch.empty(self.ids.shape, dtype=torch.long, pin_memory=pinned)
        self.copied = torch.cuda.Event() if pinned else None  # the last copy out of host_ids is done
        self.run = partial(model._exact_program, self, cache, slot, hidden_layers)
        self.out: tuple[torch.Tensor, dict[int, torch.Tensor]] | None = None
        self.graph = None
        if device.type == "cuda" and model.graphs:
            self._capture(model.graph_pool())

    def _capture(self, pool) -> None:
        # warm up on a side stream (cuBLAS sets up its workspace outside capture); the inputs are the
        # padding above, so these runs write the spare position only
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.run()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = self.run()

    def __call__(self, tokens: torch.Tensor, start: int) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """n <= rows tokens (host) of a chain at cache offset and position start.., the other rows padding;
        outputs on the device, logits and hidden states in float32, overwritten by the next call."""
        if self.copied is not None:
            self.copied.synchronize()  # a call whose outputs nobody read may still be copying from its inputs
        n, ids = len(tokens), self.host_ids
        ids[0, :n] = tokens
        ids[1, :n] = ids[2, :n] = torch.arange(start, start + n)
        ids[:2, n:] = 0
        ids[2, n:] = self.spare
        self.ids.copy_(ids, non_blocking=True)
        if self.copied is not None:
            self.copied.record()
        if self.graph is not None:
            self.graph.replay()
        elif self.out is None:
            self.out = self.run()
        else:  # eagerly too, the outputs live in fixed buffers that the next call overwrites, as a graph's do
            logits, hidden = self.run()
            self.out[0].copy_(logits)
            for layer, h in hidden.items():
                self.out[1][layer].copy_(h)
        return self.out


def chain_masks(writes: torch.Tensor, width: int, window: int) -> torch.Tensor:
    """(rows, width) bool: row_masks of a chain's rows from their cache offsets alone (in a chain each row's
    position is its offset), made on the device inside a program. A row at the last position is padding
    and sees only that key.

    >>> chain_masks(torch.tensor([2, 3, 4]), 5, 0).int().tolist()
    [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [0, 0, 0, 0, 1]]
    """
    cols, w = torch.arange(width, device=writes.device), writes[:, None]
    sees = cols <= w
    if window:
        sees &= cols > w - window
    return torch.where(w == width - 1, cols == width - 1, sees)


def row_masks(tree_mask: torch.Tensor | None, start: int, positions: torch.Tensor, window: int, rows: range,
              height: int, width: int) -> torch.Tensor:
    """(height, width) bool: [i, j] True when the segment's row rows[i] attends cache position j, exactly
    the keys the CPU runtime's row reduces over (its committed prefix from the window's start, then
    itself or its tree ancestors). Rows past len(rows) are padding: they see the last position only.

    >>> row_masks(None, 2, torch.tensor([2, 3]), 0, range(2), 3, 5).int().tolist()
    [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [0, 0, 0, 0, 1]]
    """
    mask = torch.zeros(height, width, dtype=torch.bool)
    n = len(rows)
    mask[n:, width - 1] = True
    if tree_mask is None:
        ts = torch.tensor(list(rows), dtype=torch.long)
        lo = (positions[ts] - window + 1).clamp(min=0) if window else torch.zeros(n, dtype=torch.long)
        cols = torch.arange(width)
        mask[:n] = (cols[None] >= lo[:, None]) & (cols[None] <= start + ts[:, None])
    else:
        for i, t in enumerate(rows):
            mask[i, tree_row_keys(tree_mask, t, start, positions, window)] = True
    return mask
