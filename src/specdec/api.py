"""specdec as a library: load a model once (LLM), then generate, chat and stream, one prompt or many.

    import specdec
    llm = specdec.LLM("smollm2-135m", spec_type="suffix", threads=2)
    out = llm.generate("def fib(n):", max_tokens=32)           # a Completion (specdec/completion.py)
    outs = llm.generate(["def fib(n):", [1, 2, 3]])             # texts or token ids, run as one batch
    out = llm.chat([{"role": "user", "content": "Hi!"}])        # until the model ends its turn
    stream = llm.stream("def fib(n):")
    for piece in stream: print(piece, end="")                   # text deltas; then stream.result

LLM's keyword arguments are the command line's flags (`--spec-draft-n-max` is spec_draft_n_max), and its
engine is opened by the same function `specdec generate` opens its own with (engine/setup.open_engine), so
a greedy answer here is the command line's, token for token. A guide with examples: docs/library.md.
"""

from __future__ import annotations

import json
import logging
import numbers
from collections import deque
from dataclasses import dataclass
from typing import Generator, Iterator, Sequence

from specdec.completion import Completion
from specdec.engine.setup import open_engine
from specdec.engine.spec_request import SpecRequest
from specdec.engine.validate import check_request
from specdec.model.text_stream import TextStream
from specdec.sampling import SamplingParams, is_whole

log = logging.getLogger("specdec")

DEFAULT_MAX_BATCH = 8  # sequences run together; a slot's KV cache costs memory only once a sequence uses it
GENERATE_MAX_TOKENS = 128  # `specdec generate`'s -n; chat answers until the model ends its turn


@dataclass(frozen=True)
class _Job:
    """One prompt, checked and ready for Engine.admit."""

    prompt: list[int]
    sampling: SamplingParams
    limit: int  # the engine's max_tokens (the context for "until the end")
    stop: tuple[str, ...]


class Stream:
    """The text deltas of one answer as it is written, never taken back (no stop string, no half character);
    once the loop ends, `result` holds the whole Completion. Leaving the loop early (or close()) ends the
    answer and gives its place back; `result` stays None then."""

    def __init__(self, pieces: Generator[str, None, Completion]):
        self._pieces = pieces
        self.result: Completion | None = None

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        try:
            return next(self._pieces)
        except StopIteration as end:
            if end.value is not None:
                self.result = end.value
            raise

    def close(self) -> None:
        self._pieces.close()


class LLM:
    """A target model loaded once, with the speculation its settings ask for (auto when none).

    One thread at a time: calls run on the caller's thread, and a batch runs up to max_batch sequences per
    target forward. threads sets the CPU threads of the whole process, as -t does for the command line.
    """

    def __init__(self, model: str, *, weights: str | None = None, ctx_size: int | None = None,
                 cache_type: str | None = None, device: str | None = None, threads: int | None = None,
                 max_batch: int = DEFAULT_MAX_BATCH, spec_type: str | None = None, model_draft: str | None = None,
                 spec_draft_n_max: int | None = None, spec_draft_n_min: int | None = None,
                 spec_draft_p_min: float | None = None, spec_adaptive: bool = False,
                 spec_tree_topk: int | None = None, spec_tree_budget: int | None = None,
                 spec_cross_tokenizer: bool = False, spec_typical: bool = False,
                 speculative_config: str | dict | None = None, progress: bool = True):
        """model: a catalogued name, GGUF file or Hugging Face folder. speculative_config: vLLM's object (a
        dict, or its JSON text). The rest are the flags of `specdec generate` and `serve` (docs/usage.md)."""
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a model name, GGUF file or Hugging Face folder, got {model!r}")
        for name, value in (("spec_adaptive", spec_adaptive), ("spec_cross_tokenizer", spec_cross_tokenizer),
                            ("spec_typical", spec_typical), ("progress", progress)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        if not is_whole(max_batch) or max_batch < 1:
            raise ValueError(f"max_batch must be a whole number of at least 1, got {max_batch!r}")
        if isinstance(speculative_config, dict):
            speculative_config = json.dumps(speculative_config)
        request = SpecRequest.from_flags(
            spec_type=spec_type, model_draft=model_draft, draft_n_max=spec_draft_n_max, draft_n_min=spec_draft_n_min,
            draft_p_min=spec_draft_p_min, speculative_config=speculative_config, adaptive=spec_adaptive,
            cross_tokenizer=spec_cross_tokenizer, typical=spec_typical, tree_topk=spec_tree_topk,
            tree_budget=spec_tree_budget)
        self.engine, notes = open_engine(model, request, weights=weights, ctx_size=ctx_size, cache_type=cache_type,
                                         device=device, threads=threads, max_sequences=max_batch, progress=progress)
        self.notes: tuple[str, ...] = tuple(notes)  # what the command line prints: auto's reasons, a capped context
        for note in notes:
            log.info(note)

    @property
    def tokenizer(self):
        """The model's tokenizer: encode(text) -> ids, decode(ids) -> text, apply_chat_template(messages)."""
        return self.engine.model.tokenizer

    @property
    def info(self):
        """The model's ModelInfo: name, path, sha256, architecture, formats (to_dict() for JSON)."""
        return self.engine.model.info

    @property
    def context(self) -> int:
        """Tokens a sequence holds, prompt and answer together (--ctx-size, capped to the model's)."""
        return self.engine.cache.max_len

    @property
    def speculation(self) -> str:
        """The drafters that run, e.g. "suffix" ("none": plain decoding)."""
        return self.engine.spec.method

    def __repr__(self) -> str:
        return f"LLM({self.info.name!r}, speculation={self.speculation!r}, context={self.context})"

    # -- the calls ---------------------------------------------------------------------------------
    def generate(self, prompt, max_tokens: int | None = GENERATE_MAX_TOKENS, *, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, seed: int | None = None,
                 stop: str | Sequence[str] | None = ()) -> Completion | list[Completion]:
        """prompt: a text, a list of token ids, or a list of those (a batch: a list of Completions back, in
        order, each the answer it would get alone). max_tokens: None or -1, until the model ends the answer
        or the context is full. temperature 0 (the default) is greedy; seed fixes a sampled answer."""
        prompts, batch = self._prompts(prompt)
        sampling = _sampling(temperature, top_k, top_p, min_p, seed)
        jobs = [self._job(ids, sampling, max_tokens, stop) for ids in (self._encode(p) for p in prompts)]
        results = self._run(jobs)
        return results if batch else results[0]

    def chat(self, messages, max_tokens: int | None = None, *, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, min_p: float = 0.0, seed: int | None = None,
             stop: str | Sequence[str] | None = ()) -> Completion | list[Completion]:
        """messages: [{"role": "user", "content": "..."}, ...] laid out by the model's chat template (as
        `specdec generate --chat`), or a list of such conversations (a batch). The answer runs until the
        model ends its turn or the context is full, unless max_tokens says otherwise."""
        batch = isinstance(messages, (list, tuple)) and bool(messages) and isinstance(messages[0], (list, tuple))
        sampling = _sampling(temperature, top_k, top_p, min_p, seed)
        conversations = messages if batch else [messages]
        jobs = [self._job(self._conversation(m), sampling, max_tokens, stop) for m in conversations]
        results = self._run(jobs)
        return results if batch else results[0]

    def stream(self, prompt, max_tokens: int | None = GENERATE_MAX_TOKENS, *, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, seed: int | None = None,
               stop: str | Sequence[str] | None = ()) -> Stream:
        """generate's answer to one prompt as a Stream of text deltas (checked now, run as it is read)."""
        prompts, batch = self._prompts(prompt)
        if batch:
            raise ValueError("stream takes one prompt (a text or a list of token ids); generate takes a list of them")
        job = self._job(self._encode(prompts[0]), _sampling(temperature, top_k, top_p, min_p, seed), max_tokens, stop)
        return Stream(self._stream(job))

    def stream_chat(self, messages, max_tokens: int | None = None, *, temperature: float = 0.0, top_k: int = 0,
                    top_p: float = 1.0, min_p: float = 0.0, seed: int | None = None,
                    stop: str | Sequence[str] | None = ()) -> Stream:
        """chat's answer to one conversation as a Stream of text deltas."""
        job = self._job(self._conversation(messages), _sampling(temperature, top_k, top_p, min_p, seed), max_tokens,
                        stop)
        return Stream(self._stream(job))

    # -- prompts -----------------------------------------------------------------------------------
    def _prompts(self, prompt) -> tuple[list, bool]:
        """([text or ids, ...], whether a list of prompts was given). A numpy array or torch tensor of ids is
        one prompt (1-D) or a batch of equal-length prompts (2-D)."""
        if hasattr(prompt, "tolist") and getattr(prompt, "ndim", 0) in (1, 2):
            prompt = prompt.tolist()
        if isinstance(prompt, str) or _is_ids(prompt):
            return [prompt], False
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(p, str) or _is_ids(p) for p in prompt):
            return list(prompt), True
        if isinstance(prompt, (list, tuple)) and not prompt:
            raise ValueError("no prompt: give a text, a list of token ids, or a list of those")
        raise ValueError(f"a prompt is a text or a list of token ids (whole numbers), and a batch a list of those; "
                         f"got {_short(prompt)}")

    def _encode(self, prompt) -> list[int]:
        if not isinstance(prompt, str):
            return [int(t) for t in prompt]
        if not prompt:
            raise ValueError("the prompt is empty")
        return self.tokenizer.encode(prompt)  # as `specdec generate` encodes it (BOS where the model wants one)

    def _conversation(self, messages) -> list[int]:
        """A conversation's prompt ids through the model's chat template, as `specdec generate --chat`."""
        if not isinstance(messages, (list, tuple)) or not messages:
            raise ValueError(f"messages must be a non-empty list of {{'role': ..., 'content': ...}} dicts, got "
                             f"{_short(messages)}")
        for i, m in enumerate(messages):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise ValueError(f"message {i} must be a dict with 'role' and 'content' strings, got {_short(m)}")
        if not self.tokenizer.chat_template:
            raise ValueError(f"{self.info.name} has no chat template, so chat cannot lay out a conversation; use "
                             "generate with a plain prompt")
        return self.tokenizer.encode(self.tokenizer.apply_chat_template(list(messages)), add_bos=False)

    def _job(self, prompt: list[int], sampling: SamplingParams, max_tokens, stop) -> _Job:
        """Checked as Engine.admit checks it (engine/validate.py), before anything runs."""
        if max_tokens is None or max_tokens == -1:
            limit = self.context  # the engine ends an answer when prompt + answer fill the context
        elif is_whole(max_tokens) and max_tokens >= 1:
            limit = int(max_tokens)
        else:
            raise ValueError(f"max_tokens must be a whole number of at least 1, or None (or -1: until the model "
                             f"ends the answer or the context is full), got {max_tokens!r}")
        stop = () if stop is None else stop
        if not (isinstance(stop, str) or (isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop))):
            raise ValueError(f"stop must be a string or a list of strings, got {_short(stop)}")
        prompt, stops = check_request(prompt, sampling, limit, stop, self.engine.spec, self.context,
                                      self.engine.model.config.vocab_size)
        return _Job(prompt, sampling, limit, stops)

    # -- running -----------------------------------------------------------------------------------
    def _run(self, jobs: list[_Job]) -> list[Completion]:
        """Every job to its end, up to max_batch at once in one forward per step (Engine.step_batch); a job
        joins when a slot frees. Prompts are prefilled whole, as Engine.start does, so each answer is bitwise
        the one it gets alone."""
        engine = self.engine
        waiting = deque(enumerate(jobs))
        running: list[tuple[int, _Job, object]] = []  # (index, job, Request)
        done: list[Completion | None] = [None] * len(jobs)
        try:
            while waiting or running:
                while waiting and engine.cache.free_slots:
                    i, job = waiting.popleft()
                    running.append((i, job, engine.admit(job.prompt, job.sampling, job.limit, job.stop)))
                if not running:
                    raise RuntimeError("every KV cache slot is held by an unfinished stream; read it to its end or "
                                       "close() it first")
                engine.step_batch([req for _, _, req in running])
                for entry in [e for e in running if e[2].finished]:
                    i, job, req = entry
                    engine.finish(req)
                    done[i] = Completion.of(engine.result(req), job.limit)
                    running.remove(entry)
        finally:
            for _, _, req in running:
                engine.finish(req)
        return done

    def _stream(self, job: _Job) -> Generator[str, None, Completion]:
        engine = self.engine
        text = TextStream(engine.model.tokenizer, job.stop, engine.skip_special)
        req = engine.start(job.prompt, job.sampling, job.limit, job.stop)
        try:
            while not req.finished:  # a finished request's text may hold the stop string: finish() cuts it
                piece = text.advance(req.output)
                if piece:
                    yield piece
                engine.step(req)
        finally:
            engine.finish(req)
        result = engine.result(req)
        last = text.finish(result.text)
        if last:
            yield last
        return Completion.of(result, job.limit)


def _sampling(temperature, top_k, top_p, min_p, seed) -> SamplingParams:
    top_k = 0 if is_whole(top_k) and top_k == -1 else top_k  # vLLM's "off" as well as 0
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)


def _is_ids(value) -> bool:
    """A non-empty list or tuple of whole numbers (numpy's too), no bools: one prompt of token ids."""
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in value)


def _short(value) -> str:
    """A value for an error message: its type, and its text when short."""
    text = repr(value)
    return f"{type(value).__name__} {text}" if len(text) <= 60 else type(value).__name__
