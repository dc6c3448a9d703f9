"""Multi-turn agent sessions (bench/sets/agentic.jsonl): time to first token per turn with the prefix cache,
decode speed, and speculative output against plain output, turn by turn.

A session is a scripted conversation: a system prompt (tools, or a JSON format), user turns, the assistant's
turns (tool calls in the Hermes/Qwen `<tool_call>` format, or JSON objects) and tool results. Turn t asks the
model for the t-th assistant message given everything before it; the history always holds the scripted
assistant messages, not the model's, so every method and every run sees the same prompts, and each prompt
extends the last one: what the prefix cache is for.

    specdec bench -m qwen2.5-coder-1.5b --sessions --methods none,auto,suffix --constrain both --peers llama-server

(bench/session_bench.py runs them, bench/session_report.py writes the table; this command replaces the
`python -m specdec.bench.sessions` of before.)
Each method runs each session on a fresh engine (an empty cache), so a method's warm turns find what plain
decoding's found, and "same" compares their tokens turn by turn.

Constraints: a session may carry OpenAI's "response_format" (a json_schema every assistant turn follows) or
"tools" (OpenAI's function list: the turns whose scripted answer is a <tool_call> follow the call grammar of
tool_choice "required", server/tools.py). Session.constraint(t) says which, turn by turn.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.sampling import SamplingParams
from specdec.server.tools import OPEN as TOOL_CALL
from specdec.server.tools import call_grammar

DEFAULT_SESSIONS = Path(__file__).resolve().parent / "sets" / "agentic.jsonl"  # shipped as package data
DEFAULT_MAX_TOKENS = 48  # a turn's answer budget where the file's {"_meta"} line names none


@dataclass(frozen=True)
class Session:
    id: str
    category: str
    messages: tuple[dict, ...]
    response_format: dict | None = None  # OpenAI's {"type": "json_schema", "json_schema": {"schema": ...}}
    tools: tuple[dict, ...] = ()  # OpenAI's [{"type": "function", "function": {...}}]

    def answers(self) -> list[str]:
        """The scripted assistant messages, turn by turn."""
        return [m["content"] for m in self.messages if m["role"] == "assistant"]

    def constraint(self, t: int) -> tuple[str, str] | None:
        """(grammar kind, text) that turn t (1-based) follows when the sessions run constrained; None: free.
        A json_schema response_format holds every turn; tools hold the turns whose scripted answer is a call."""
        if self.response_format is not None:
            schema = self.response_format.get("json_schema", {}).get("schema") or {"type": "object"}
            return "json_schema", json.dumps(schema)
        if self.tools and self.answers()[t - 1].startswith(TOOL_CALL):
            return "gbnf", call_grammar(list(self.tools), "required")  # a Lark grammar: the gbnf kind reads it
        return None

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
    constrained: bool = False  # the turn followed its Session.constraint


def max_tokens_of(path: str | Path = DEFAULT_SESSIONS) -> int:
    """The answer budget the file's {"_meta"} line names ("max_tokens"), else DEFAULT_MAX_TOKENS."""
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            meta = json.loads(line).get("_meta")
            return int(meta.get("max_tokens", DEFAULT_MAX_TOKENS)) if isinstance(meta, dict) else DEFAULT_MAX_TOKENS
    return DEFAULT_MAX_TOKENS


def load_sessions(path: str | Path = DEFAULT_SESSIONS) -> list[Session]:
    """The sessions of a JSON Lines file ({"id", "category", "messages"} a line, optionally "response_format"
    or "tools"; a {"_meta"} line is skipped)."""
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
        fmt = obj.get("response_format")
        if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "json_schema"):
            raise ValueError(f"{path}:{number}: a session's response_format must be "
                             '{"type": "json_schema", "json_schema": {"schema": {...}}}')
        sessions.append(Session(obj["id"], obj.get("category", "agentic"), tuple(messages), fmt,
                                tuple(obj.get("tools") or ())))
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


def run_session(engine: Engine, session: Session, max_tokens: int, spec: SpecConfig | None = None,
                grammars: list | None = None) -> list[Turn]:
    """Every turn of `session`, in order, on `engine` (its prefix cache as it is), greedy. grammars: one compiled
    Grammar (or None) per turn, compiled before (outside the timing); None: every turn free."""
    out = []
    for t, history in enumerate(session.turns(), 1):
        ids = render(engine.model.tokenizer, history)
        grammar = grammars[t - 1] if grammars else None
        start = time.perf_counter()
        req = engine.admit(ids, SamplingParams(grammar=grammar), max_tokens, spec=spec)
        try:
            while not req.output and not req.finished:
                engine.step_batch([req])
            first = time.perf_counter()
            while not req.finished:
                engine.step_batch([req])
        finally:
            engine.finish(req)
        out.append(Turn(session.id, t, len(ids), req.cached_tokens, first - start, time.perf_counter() - first,
                        tuple(req.output), grammar is not None))
    return out


def spec_of(method: str) -> SpecConfig:
    """"none": plain decoding; otherwise drafter kinds joined by '+' (suffix, ngram-simple, ...)."""
    return SpecConfig() if method == "none" else SpecConfig(drafters=tuple(method.split("+")))
