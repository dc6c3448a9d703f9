"""Multi-turn agent sessions (bench/sets/agentic.jsonl): time to first token per turn with the prefix cache,
decode speed, and speculative output against plain output, turn by turn.

A session is a scripted conversation: a system prompt (tools, or a JSON format), user turns, the assistant's
turns (tool calls in the Hermes/Qwen `<tool_call>` format, or JSON objects) and tool results. Turn t asks the
model for the t-th assistant message given everything before it; the history always holds the scripted
assistant messages, not the model's, so every method and every run sees the same prompts, and each prompt
extends the last one: what the prefix cache is for.

    python -m specdec.bench.sessions -m qwen2.5-coder-1.5b --methods none,suffix --prefix-cache on

Each method runs each session on a fresh engine (an empty cache), so a method's warm turns find what plain
decoding's found, and "same" compares their tokens turn by turn.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.engine.prefix_cache import PREFIX_CACHE_MODES
from specdec.sampling import SamplingParams

DEFAULT_SESSIONS = Path(__file__).resolve().parent / "sets" / "agentic.jsonl"  # shipped as package data


@dataclass(frozen=True)
class Session:
    id: str
    category: str
    messages: tuple[dict, ...]

    def turns(self) -> list[list[dict]]:
        """The history before each assistant message: turn t's conversation so far."""
        return [list(self.messages[:i]) for i, m in enumerate(self.messages) if m["role"] == "assistant"]


@dataclass(frozen=True)
class Turn:
    session: str
    turn: int  # 1-based
    prompt_tokens: int
    cached_tokens: int  # prompt tokens the prefix cache gave
    ttft_s: float  # admission to the first token: the prefill of what the cache lacked, and one step
    decode_s: float
    token_ids: tuple[int, ...]


def load_sessions(path: str | Path = DEFAULT_SESSIONS) -> list[Session]:
    """The sessions of a JSON Lines file ({"id", "category", "messages"} a line; a {"_meta"} line is skipped)."""
    sessions = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        obj = json.loads(line)
        if "_meta" in obj:
            continue
        messages = obj.get("messages")
        if not isinstance(messages, list) or not any(m.get("role") == "assistant" for m in messages):
            raise ValueError(f"{path}:{number}: a session needs 'messages' with at least one assistant message")
        sessions.append(Session(obj["id"], obj.get("category", "agentic"), tuple(messages)))
    return sessions


def render(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a conversation, ready for the assistant's answer. A template without a tool role gets
    tool results as user messages."""
    try:
        text = tokenizer.apply_chat_template(messages)
    except Exception:  # noqa: BLE001 - the template's own error for a role it does not know
        text = tokenizer.apply_chat_template([m if m["role"] != "tool" else
                                              {"role": "user", "content": "Tool result: " + m["content"]}
                                              for m in messages])
    return tokenizer.encode(text, add_bos=False)


def run_session(engine: Engine, session: Session, max_tokens: int, spec: SpecConfig | None = None) -> list[Turn]:
    """Every turn of `session`, in order, on `engine` (its prefix cache as it is), greedy."""
    out = []
    for t, history in enumerate(session.turns(), 1):
        ids = render(engine.model.tokenizer, history)
        start = time.perf_counter()
        req = engine.admit(ids, SamplingParams(), max_tokens, spec=spec)
        try:
            while not req.output and not req.finished:
                engine.step_batch([req])
            first = time.perf_counter()
            while not req.finished:
                engine.step_batch([req])
        finally:
            engine.finish(req)
        out.append(Turn(session.id, t, len(ids), req.cached_tokens, first - start, time.perf_counter() - first,
                        tuple(req.output)))
    return out


def spec_of(method: str) -> SpecConfig:
    """"none": plain decoding; otherwise drafter kinds joined by '+' (suffix, ngram-simple, ...)."""
    return SpecConfig() if method == "none" else SpecConfig(drafters=tuple(method.split("+")))


def main(argv: list[str] | None = None) -> int:
    from specdec.model.load import load_model

    p = argparse.ArgumentParser(prog="python -m specdec.bench.sessions", description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--weights", default="gguf")
    p.add_argument("--sessions", default=str(DEFAULT_SESSIONS))
    p.add_argument("--methods", default="none,suffix", help="comma-separated: none, or kinds joined by '+'")
    p.add_argument("--prefix-cache", choices=PREFIX_CACHE_MODES, default="on")
    p.add_argument("--max-tokens", type=int, default=48)
    args = p.parse_args(argv)
    sessions = load_sessions(args.sessions)
    model = load_model(args.model, args.weights, progress=False)
    methods = args.methods.split(",")
    results: dict[str, list[Turn]] = {}
    for method in methods:
        results[method] = [turn for s in sessions for turn in run_session(
            Engine(model, max_len=4096, prefix_cache=args.prefix_cache), s, args.max_tokens, spec_of(method))]
    base = results[methods[0]]
    print(f"{'session':14} turn prompt cached " + " ".join(f"{m + ' ttft':>16} {'tok/s':>7}" for m in methods) +
          "  same")
    for i, ref in enumerate(base):
        cells = []
        for m in methods:
            r = results[m][i]
            rate = (len(r.token_ids) - 1) / r.decode_s if r.decode_s > 0 and len(r.token_ids) > 1 else 0.0
            cells.append(f"{r.ttft_s:15.3f}s {rate:7.1f}")
        same = all(results[m][i].token_ids == ref.token_ids for m in methods)
        print(f"{ref.session:14} {ref.turn:4} {ref.prompt_tokens:6} {ref.cached_tokens:6} " + " ".join(cells) +
              f"  {'yes' if same else 'NO'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
