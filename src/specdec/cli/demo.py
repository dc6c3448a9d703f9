"""The main job: one speculative generation on the default model, beside plain decoding.

    specdec demo [--model M] [--spec-type ngram-simple] [--repeats 3]

Plain and speculative runs alternate in one process; the report gives medians, the
speed-up, acceptance, and whether the greedy outputs are identical token for token.
"""

from __future__ import annotations

import statistics

import torch

from specdec.drafters.registry import DEFAULT_DRAFT_LENGTH
from specdec.engine.spec_request import SpecRequest, build_spec
from specdec.engine.engine import Engine
from specdec.model.device import pick_device
from specdec.model.load import load_model
from specdec.sampling import SamplingParams

PROMPT = """Rename the function `get_user` to `fetch_user` everywhere in this code, and return the full code.

def get_user(db, user_id):
    row = db.query("SELECT * FROM users WHERE id = ?", user_id)
    if row is None:
        raise KeyError(user_id)
    return row

def get_user_name(db, user_id):
    return get_user(db, user_id)["name"]

def get_user_email(db, user_id):
    return get_user(db, user_id)["email"]
"""


def _on_device(model) -> str:
    """' (bf16 on cuda)' for a model on a GPU: the dtype its values are computed in there; '' on the CPU."""
    if model.info.device == "cpu":
        return ""
    return f" ({str(model.transformer.dtype).removeprefix('torch.')} on {model.info.device})"


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="the main job: a speculative generation beside plain decoding, with the speed-up")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--weights", default=None, help="in-memory weight format (default: gguf for a GGUF file)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when torch sees a GPU)")
    p.add_argument("--spec-type", default="suffix")
    p.add_argument("--draft-n-max", type=int, default=DEFAULT_DRAFT_LENGTH)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=3)
    p.set_defaults(func=cmd_demo)


def cmd_demo(args) -> int:
    model = load_model(args.model, args.weights, device=pick_device(args.device))
    tok = model.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}]), add_bos=False)
    engine = Engine(model, max_len=2048)
    spec, _notes = build_spec(SpecRequest.from_flags(spec_type=args.spec_type, draft_n_max=args.draft_n_max))
    greedy = SamplingParams()
    engine.generate(ids, greedy, max_tokens=8)  # warm-up
    plain_tps, spec_tps, ratios = [], [], []
    for _ in range(args.repeats):
        plain = engine.generate(ids, greedy, max_tokens=args.max_tokens)
        fast = engine.generate(ids, greedy, max_tokens=args.max_tokens, spec=spec)
        plain_tps.append(plain.decode_tokens_per_s)
        spec_tps.append(fast.decode_tokens_per_s)
        ratios.append(fast.decode_tokens_per_s / plain.decode_tokens_per_s)
    info = model.info
    print(f"model: {info.name} {info.path}\n  sha256 {info.sha256}, file {info.quant}, weights in memory "
          f"{info.weights_dtype}{_on_device(model)}, "
          f"{info.params / 1e6:.0f}M params; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"prompt: {len(ids)} tokens (code editing), {args.max_tokens} new tokens, greedy, {args.repeats} repeats")
    print(f"output:\n{fast.text}\n")
    print(f"plain decoding:        {statistics.median(plain_tps):7.1f} tok/s (median)")
    print(f"{spec.method + ' k=' + str(spec.draft_n_max) + ':':<22} {statistics.median(spec_tps):7.1f} tok/s (median)")
    print(f"speed-up:              {statistics.median(ratios):7.2f}x (median of per-pair ratios)")
    print(fast.stats.summary())
    same = plain.token_ids == fast.token_ids
    print(f"greedy output identical to plain decoding: {'yes' if same else 'NO'} ({len(fast.token_ids)} tokens)")
    return 0 if same else 1

