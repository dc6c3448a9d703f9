"""The device runtime on a GPU in one run: a random-weight model of Llama-3-8B's shape built there (no model
file travels), plain decode tok/s, the verify cost curve for t = 1..16, the share of memory bandwidth one
decode step reaches, and greedy speculative output against plain decoding through the engine.

    PYTHONPATH=src python3 scripts/cuda_check.py --out $OUT        # a GPU machine: writes cuda-check.md, .json
    python scripts/cuda_check.py --shape tiny --device cpu         # the same steps, small, on the CPU
    (--shape small: Llama-3's head layout, 4 layers; a first look on a GPU in seconds)

What it reports, all measured in this one process:
- copy bandwidth: a device-to-device copy of 2 GiB (bytes read + written per second), the practical peak;
- the cost of one exact forward of t new tokens after 512 (engine/cost.measure_forward_cost, medians),
  with CUDA graphs and, for t = 1, without them (the same programs run eagerly);
- bytes one decode step reads (weights + the slot's whole key buffer, which the fixed-shape attention reads)
  per second of it, against the copy bandwidth and the chip's nominal figure where known;
- greedy output of the engine with suffix drafting and with a replay drafter (the plain output's next
  tokens, every fourth one wrong, up to 15 a step) against plain greedy decoding, token for token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers.tiny: a byte-level tokenizer

from specdec.drafters.base import Draft, DrafterBase  # noqa: E402
from specdec.engine.config import SpecConfig  # noqa: E402
from specdec.engine.cost import measure_forward_cost  # noqa: E402
from specdec.engine.engine import Engine  # noqa: E402
from specdec.model.config import ModelConfig  # noqa: E402
from specdec.model.device import DenseLayer, DeviceTransformer, pick_device  # noqa: E402
from specdec.model.load import Model, ModelInfo  # noqa: E402
from specdec.sampling import SamplingParams  # noqa: E402

SHAPES = {
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                      intermediate_size=14336, rope_theta=500000.0, context_length=8192),
    "small": dict(vocab_size=32000, hidden_size=1024, num_layers=4, num_heads=8, num_kv_heads=2, head_dim=128,
                  intermediate_size=2816, rope_theta=500000.0, context_length=8192),  # Llama-3's heads, small
    "tiny": dict(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                 intermediate_size=128, context_length=1024),
}
NOMINAL_GBS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0}  # HBM bandwidth on the data sheets, GB/s
WIDTHS = 16
CONTEXT = 512


def random_model(shape: str, device: str, dtype: torch.dtype, seed: int = 0) -> DeviceTransformer:
    """Random weights of the shape, made on the device (std 0.02; norms 1), as a DeviceTransformer."""
    c = ModelConfig(arch="llama", **SHAPES[shape])
    g = torch.Generator(device=device).manual_seed(seed)

    def w(*size, std=0.02):
        return (torch.randn(*size, generator=g, device=device, dtype=torch.float32) * std).to(dtype)

    def ones(n):
        return torch.ones(n, device=device, dtype=dtype)

    qkv = c.q_size + 2 * c.kv_size
    layers = [DenseLayer(w(qkv, c.hidden_size), None, w(c.hidden_size, c.q_size), w(2 * c.intermediate_size, c.hidden_size),
                         w(c.hidden_size, c.intermediate_size), ones(c.hidden_size), ones(c.hidden_size))
              for _ in range(c.num_layers)]
    return DeviceTransformer(c, w(c.vocab_size, c.hidden_size, std=1.0), layers, ones(c.hidden_size),
                             w(c.vocab_size, c.hidden_size), device)


def byte_tokenizer(vocab: int):
    """The tests' byte-level BPE tokenizer padded to `vocab` ids, with no end-of-sequence id (a random model's
    output would stop anywhere; every run here makes max_tokens)."""
    from helpers.tiny import write_tokenizer_json
    from specdec.model.tokenizer import tokenizer_from_hf_folder

    folder = Path(tempfile.mkdtemp())
    write_tokenizer_json(folder, vocab)
    tok = tokenizer_from_hf_folder(folder, {})
    tok.eos_ids = []
    return tok


class Replay(DrafterBase):
    """Drafts what plain decoding produced next, with every fourth drafted token wrong: accepted runs of
    0..3 tokens, rejections at every depth."""

    name = "replay"

    def __init__(self, outputs: dict[tuple[int, ...], list[int]]):
        self.outputs, self.prompt, self.count = outputs, (), 0

    def begin(self, prompt, sampling=None, generator=None):
        self.prompt = tuple(prompt)

    def propose(self, context, draft_length):
        done = len(context) - len(self.prompt)
        plain = self.outputs[self.prompt][done : done + draft_length]
        tokens = []
        for t in plain:
            self.count += 1
            tokens.append(t if self.count % 4 else (t + 1) % 100)
        return Draft.chain(tokens)


def copy_bandwidth(device: str) -> float:
    """GB/s of a device-to-device copy, bytes read + written (the median of 10)."""
    n = 2**30 if device.startswith("cuda") else 2**26
    a, b = torch.empty(n, dtype=torch.uint8, device=device), torch.empty(n, dtype=torch.uint8, device=device)
    times = []
    for _ in range(12):
        _sync(device)
        t0 = time.perf_counter()
        b.copy_(a)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * n / statistics.median(times[2:]) / 1e9


def linears_ms(tr: DeviceTransformer, rows: int, device: str) -> float:
    """ms of the matrices alone of one step of `rows` rows (every layer's four and the output head, the
    median of 10): the floor the rest of a step adds to."""
    embed, layers, norm, lm_head = tr.weights
    x = torch.zeros(rows, tr.config.hidden_size, dtype=embed.dtype, device=device)
    a = torch.zeros(rows, max(layer.down.shape[1] for layer in layers), dtype=embed.dtype, device=device)
    q = torch.zeros(rows, layers[0].o.shape[1], dtype=embed.dtype, device=device)
    times = []
    for _ in range(12):
        _sync(device)
        t0 = time.perf_counter()
        for layer in layers:
            torch.nn.functional.linear(x, layer.qkv)
            torch.nn.functional.linear(q, layer.o)
            torch.nn.functional.linear(x, layer.gate_up)
            torch.nn.functional.linear(a, layer.down)
        torch.nn.functional.linear(x, lm_head)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:]) * 1e3


def profile_step(eager: DeviceTransformer, ctx_size: int, device: str, out: str | None) -> None:
    """torch.profiler's table of one eager decode step after CONTEXT tokens, by device time (on CUDA the
    kernels a graph replays, one launch each): printed, and written to cuda-profile.txt under `out`."""
    from torch.profiler import ProfilerActivity, profile

    cache = eager.new_cache(ctx_size)
    slot = cache.allocate()
    eager.forward(torch.zeros(1, CONTEXT, dtype=torch.long), cache, [slot], exact=False, last_only=True)
    step = torch.zeros(1, 1, dtype=torch.long)
    for _ in range(2):  # warm: the program's first run, the library's workspaces
        eager.forward(step, cache, [slot])
        cache.truncate(slot, CONTEXT)
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        eager.forward(step, cache, [slot])
        _sync(device)
    table = prof.key_averages().table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=30,
                                      max_name_column_width=80)
    print(table)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "cuda-profile.txt").write_text(table)


def replay_ms(cache, device: str) -> float:
    """ms of the decode program's device work alone (a graph replay on CUDA, the ops eagerly elsewhere; the
    median of 10): what a step costs less the host's share (inputs, masks, the copy of the logits back)."""
    program = next(iter(cache.programs.values()))
    times = []
    for _ in range(12):
        _sync(device)
        t0 = time.perf_counter()
        program.graph.replay() if program.graph is not None else program.run()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:]) * 1e3


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="llama3-8b", choices=list(SHAPES))
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    p.add_argument("--ctx-size", type=int, default=4096, help="the cache every program reads in full")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--out", default=None, help="folder for cuda-check.md and cuda-check.json")
    p.add_argument("--profile", action="store_true",
                   help="also write cuda-profile.txt: the kernels of one eager decode step, by device time")
    args = p.parse_args()
    device = pick_device(args.device)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    facts = {"shape": args.shape, "device": device, "dtype": str(dtype), "torch": torch.__version__,
             "ctx_size": args.ctx_size}
    if device.startswith("cuda"):
        facts["gpu"] = torch.cuda.get_device_name(device)
    facts["copy_gbs"] = copy_bandwidth(device)

    t0 = time.perf_counter()
    tr = random_model(args.shape, device, dtype)
    _sync(device)
    facts["build_s"] = time.perf_counter() - t0
    c = tr.config
    weight_bytes = tr.weight_bytes_per_token()
    params = sum(t.numel() for t in tr.weight_tensors())
    info = ModelInfo(f"random {args.shape}", "", "", "llama", "random", str(dtype).removeprefix("torch."), params,
                     weight_bytes, device, kv_cache=str(tr.kv_dtype).removeprefix("torch."))
    model = Model(tr, byte_tokenizer(c.vocab_size), info, None)

    # the verify cost curve, with graphs (first call captures), then t = 1 eagerly
    cache = tr.new_cache(args.ctx_size)
    kv_bytes = c.num_layers * 2 * c.kv_size * cache.width * torch.finfo(dtype).bits // 8  # the slot's keys, values
    t0 = time.perf_counter()
    measure_forward_cost(tr, cache, 1, context=CONTEXT, repeats=1)  # captures the program of this cache's slot
    facts["first_step_s"] = time.perf_counter() - t0
    cost = measure_forward_cost(tr, cache, WIDTHS, context=CONTEXT, repeats=10)
    facts["cost_ms"] = {t: cost[t] * 1e3 for t in range(1, WIDTHS + 1)}
    eager = DeviceTransformer(c, *tr.weights, device, graphs=False)
    facts["eager_step_ms"] = measure_forward_cost(eager, eager.new_cache(args.ctx_size), 1, context=CONTEXT,
                                                  repeats=10)[1] * 1e3
    facts["linears_ms"] = {rows: linears_ms(tr, rows, device) for rows in (1, tr.rows)}
    facts["replay_ms"] = replay_ms(cache, device)
    if args.profile:
        profile_step(eager, args.ctx_size, device, args.out)
    step_s = cost[1]
    facts["step_gbs"] = (weight_bytes + kv_bytes) / step_s / 1e9
    facts["weight_bytes"], facts["kv_bytes_read"] = weight_bytes, kv_bytes
    nominal = next((v for k, v in NOMINAL_GBS.items() if k in facts.get("gpu", "")), None)
    facts["nominal_gbs"] = nominal

    # plain decoding through the engine, then speculation against it, token for token
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, c.vocab_size, (n,), generator=gen).tolist() for n in (128, 300, 64)]
    prompts.append(prompts[0][:16] * 8)  # repeated text: suffix drafting has something to find
    engine = Engine(model, max_len=args.ctx_size)
    plain, rates = {}, []
    for prompt in prompts:
        out = engine.generate(prompt, SamplingParams(), max_tokens=args.max_tokens, spec=SpecConfig(drafters=()))
        plain[tuple(prompt)] = out.token_ids
        rates.append(out.decode_tokens_per_s)
    facts["plain_tok_s"] = statistics.median(rates)
    checks = {}
    for label, spec, factory in (
            ("suffix", SpecConfig(drafters=("suffix",), draft_n_max=8), None),
            ("replay", SpecConfig(drafters=("suffix",), draft_n_max=15), lambda kind, s: Replay(plain))):
        spec_engine = Engine(model, spec, max_len=args.ctx_size, drafter_factory=factory)
        same, drafted, accepted, rates = 0, 0, 0, []
        for prompt in prompts:
            out = spec_engine.generate(prompt, SamplingParams(), max_tokens=args.max_tokens)
            same += out.token_ids == plain[tuple(prompt)]
            drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
            rates.append(out.decode_tokens_per_s)
        checks[label] = {"identical": f"{same}/{len(prompts)}", "drafted": drafted, "accepted": accepted,
                         "tok_s": statistics.median(rates)}
    facts["speculation"] = checks
    facts["all_identical"] = all(v["identical"] == f"{len(prompts)}/{len(prompts)}" for v in checks.values())
    report(facts, args.out)
    if not facts["all_identical"]:
        sys.exit(1)


def report(f: dict, out: str | None) -> None:
    curve = " | ".join(f"{f['cost_ms'][t]:.2f}" for t in f["cost_ms"])
    lines = [
        f"# specdec device runtime: {f['shape']} (random weights) on {f.get('gpu', f['device'])}", "",
        f"torch {f['torch']}, {f['dtype']}, cache of {f['ctx_size']} tokens (every exact step reads all of it). "
        f"Built in {f['build_s']:.1f} s; first step (program capture) {f['first_step_s']:.2f} s.", "",
        f"- plain decode through the engine: **{f['plain_tok_s']:.1f} tok/s** (median of the prompts)",
        f"- one decode step: {f['cost_ms'][1]:.2f} ms "
        f"{'with CUDA graphs' if f['device'].startswith('cuda') else 'as programs'} (the program alone "
        f"{f['replay_ms']:.2f} ms, the rest is the host's), {f['eager_step_ms']:.2f} ms eagerly; "
        f"its matrices alone (eager, no attention) {f['linears_ms'][max(f['linears_ms'])]:.2f} ms at the program's {max(f['linears_ms'])} rows, "
        f"{f['linears_ms'][1]:.2f} ms at 1 row",
        f"- bytes read per step: {f['weight_bytes'] / 1e9:.2f} GB of weights + {f['kv_bytes_read'] / 1e9:.2f} GB of "
        f"keys and values = **{f['step_gbs']:.0f} GB/s**, {100 * f['step_gbs'] / f['copy_gbs']:.0f}% of the measured "
        f"copy bandwidth ({f['copy_gbs']:.0f} GB/s)"
        + (f", {100 * f['step_gbs'] / f['nominal_gbs']:.0f}% of the nominal {f['nominal_gbs']:.0f} GB/s"
           if f["nominal_gbs"] else ""),
        "", "Verify cost, one exact forward of t new tokens after 512 (ms):", "",
        "| t | " + " | ".join(str(t) for t in f["cost_ms"]) + " |",
        "|---|" + "---|" * len(f["cost_ms"]), f"| ms | {curve} |", "",
        "Greedy speculation against plain decoding (the engine, token for token):", "",
        "| drafter | identical | drafted | accepted | tok/s |", "|---|---|---|---|---|"]
    for label, v in f["speculation"].items():
        lines.append(f"| {label} | {v['identical']} | {v['drafted']} | {v['accepted']} | {v['tok_s']:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "cuda-check.md").write_text(text)
        (Path(out) / "cuda-check.json").write_text(json.dumps(f, indent=1))


if __name__ == "__main__":
    main()
