"""Command-line flags the commands share, turned into typed settings once.

    add_model_args(parser); add_threads_args(parser); add_spec_args(parser); add_sampling_args(parser)
    request = spec_request(args)            # SpecRequest: what the user said about speculation
    engine, sampling = build_engine(args)   # target loaded, speculation decided (auto included)

generate, chat and serve build their engine here (engine/setup.open_engine, which specdec.LLM opens
its engine with too); export-config, inspect and bench read the same flags. engine/ never sees an argparse
object.
"""

from __future__ import annotations

import argparse
import sys

from specdec.drafters import registry
from specdec.drafters.registry import DEFAULT_DRAFT_LENGTH
from specdec.engine.setup import DEFAULT_CTX_SIZE, capped_context_note, open_engine
from specdec.engine.spec_request import SpecRequest
from specdec.model.linear import WEIGHT_FORMATS
from specdec.model.transformer import CACHE_TYPES
from specdec.sampling import SamplingParams

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_MAX_TOKENS = 128  # generate's -n; chat answers until the model ends the turn (-n -1)
UNLIMITED = -1  # -n -1, as llama.cpp's: until the model ends the answer or the context is full


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", default=DEFAULT_MODEL, help="model name, GGUF file or HF folder")
    p.add_argument("--weights", default=None, choices=list(WEIGHT_FORMATS),
                   help="in-memory weight format (default: gguf for a GGUF file, i.e. the file's own quantized "
                        "blocks computed as stored; int8 for a Hugging Face folder)")
    p.add_argument("--ctx-size", "-c", type=int, default=None,
                   help=f"KV cache length in tokens per sequence (default {DEFAULT_CTX_SIZE}, or the model's context "
                        "length where that is shorter; 0: the model's whole context length)")
    p.add_argument("--cache-type", default=None, choices=list(CACHE_TYPES),
                   help="what the KV cache holds on the CPU (default f16, as llama.cpp's; f32 with --weights fp32): "
                        "f16 reads half the bytes at long contexts; output stays exact either way")
    p.add_argument("--device", default=None,
                   help="cpu or cuda (cuda:N): where the target runs (default: cuda when torch sees a GPU). On cuda "
                        "every exact step is one CUDA graph of 16 rows over the whole --ctx-size cache")


def add_spec_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative decoding (llama.cpp and vLLM style)")
    runnable = [e.kind for e in registry.entries() if e.runnable]
    g.add_argument("--spec-type", default=None,
                   help=f"comma list: none, {', '.join(runnable)}; or auto (the default when no speculation flag "
                        "is given)")
    g.add_argument("--model-draft", "-md", default=None,
                   help="draft model (name, GGUF file or HF folder), or a head folder: MTP (`specdec train mtp --out`), "
                        "EAGLE-3, DFlash, DSpark")
    g.add_argument("--spec-draft-n-max", type=int, default=None,
                   help=f"most drafted tokens per step (default {DEFAULT_DRAFT_LENGTH})")
    g.add_argument("--spec-draft-n-min", type=int, default=None, help="shorter drafts are not verified")
    g.add_argument("--spec-draft-p-min", type=float, default=None, help="model drafter stops below this confidence")
    g.add_argument("--spec-adaptive", action="store_true", help="adapt the draft length to recent acceptance")
    g.add_argument("--spec-tree-topk", type=int, default=None,
                   help="draft-mtp / draft-eagle3: children per tree node (1 = a chain, the default)")
    g.add_argument("--spec-tree-budget", type=int, default=None,
                   help="draft-mtp / draft-eagle3: most tokens in a draft tree (default topk x draft length)")
    g.add_argument("--spec-cross-tokenizer", action="store_true",
                   help="allow a draft model with another tokenizer (drafts pass through text)")
    g.add_argument("--spec-typical", action="store_true",
                   help="relaxed typical acceptance for sampling: faster, LOSSY (output distribution changes)")
    g.add_argument("--speculative-config", default=None,
                   help='vLLM style JSON, e.g. \'{"method": "draft_model", "model": "...", '
                        '"num_speculative_tokens": 3}\'')


def add_threads_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", "-t", type=int, default=None,
                   help="CPU threads for torch and the C kernels, as llama.cpp's -t (default: torch's, the "
                        "physical cores)")


def add_sampling_args(p: argparse.ArgumentParser, max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
    p.add_argument("--max-tokens", "-n", type=int, default=max_tokens,
                   help="most tokens an answer gets; -1: until the model ends it or the context is full "
                        "(llama.cpp's -n -1)")
    p.add_argument("--temperature", "--temp", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default, or -1 as in llama.cpp: a random one)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def spec_request(args: argparse.Namespace) -> SpecRequest:
    """The speculative flags of `add_spec_args` as a SpecRequest."""
    return SpecRequest.from_flags(
        spec_type=args.spec_type, model_draft=args.model_draft, draft_n_max=args.spec_draft_n_max,
        draft_n_min=args.spec_draft_n_min, draft_p_min=args.spec_draft_p_min,
        speculative_config=args.speculative_config, adaptive=args.spec_adaptive,
        cross_tokenizer=args.spec_cross_tokenizer, typical=args.spec_typical, tree_topk=args.spec_tree_topk,
        tree_budget=args.spec_tree_budget,
    )


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    seed = None if args.seed == -1 else args.seed  # llama.cpp's -s -1: a random seed (it was the fixed seed -1)
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          seed=seed)


def build_engine(args: argparse.Namespace):
    """Load the target and set up speculation (engine/setup.open_engine); prints the notes a user must see.

    Returns (engine, sampling). Explicit flags are checked before the model loads.
    """
    request = spec_request(args)
    sampling = sampling_from_args(args)  # a bad --seed is an error before the load too
    engine, notes = open_engine(args.model, request, weights=args.weights, ctx_size=args.ctx_size,
                                cache_type=args.cache_type, device=args.device, threads=args.threads,
                                max_sequences=getattr(args, "max_batch", 1))
    for note in notes:
        print(note if note.startswith("auto: ") else f"note: {note}", file=sys.stderr)
    return engine, sampling


def check_max_tokens(max_tokens: int) -> None:
    """-n: at least 1, or -1 (UNLIMITED)."""
    if max_tokens < 1 and max_tokens != UNLIMITED:
        raise ValueError(f"--max-tokens must be at least 1, or -1 (until the model ends the answer or the context is "
                         f"full), got {max_tokens}")


def token_limit(max_tokens: int, engine) -> int:
    """The engine's max_tokens for -n: -1 is the context (the engine ends an answer there first)."""
    return engine.cache.max_len if max_tokens == UNLIMITED else max_tokens
