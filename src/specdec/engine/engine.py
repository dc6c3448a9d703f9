"""The draft -> verify -> commit loop.

Plain decoding is the same loop with an empty draft: both feed [last token] + draft through one exact
forward, so greedy speculative output equals plain greedy output token for token (model/transformer.py).

    engine = Engine(model, SpecConfig(drafters=("ngram-simple",)))
    result = engine.generate(prompt_ids, SamplingParams(), max_tokens=64)
    result.token_ids, result.stats.summary()

Several sequences share one forward per step (continuous batching, server/scheduler.py):

    engine = Engine(model, spec, max_sequences=16)
    a, b = engine.admit(prompt_a), engine.admit(prompt_b)   # slots and drafters, no forward yet
    engine.step_batch([a, b], prefill_chunk=256)            # prompts prefilled in chunks, then drafts

Each sequence's rows are computed bitwise as they would be alone (Transformer.forward_batch),
so batching never changes an answer. Beside it: a request's state (request.py), its part of a step
(plan.py), its draft length (draft_length.py, priced by cost.py), stop strings (stop.py), argument
checks (validate.py), drafter sets per SpecConfig (pool.py), draft models (draft_models.py), grammar
(constrain.py), prefix reuse (prefix_cache.py), logprobs (logprobs.py), and what a plain step costs
(step_clock.py), against which a request's verdict (verdict.py) is judged.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, Sequence

import torch

from specdec.drafters import registry
from specdec.drafters.base import Draft, Drafter
from specdec.drafters.registry import BuildContext, DrafterSpec
from specdec.engine.config import SpecConfig
from specdec.engine.constrain import Constraint, with_grammar_drafter
from specdec.engine.cost import measure_forward_cost, widest_forward
from specdec.engine.draft_length import DraftLengthPolicy
from specdec.engine.draft_models import DraftModels
from specdec.engine.logprobs import check_top_logprobs, token_logprobs
from specdec.engine.plan import Plan, tree_layout
from specdec.engine.pool import DrafterPool
from specdec.engine.prefix_cache import PrefixCache
from specdec.engine.request import GenerationResult, Request
from specdec.engine.stats import SpecStats
from specdec.engine.step_clock import StepClock
from specdec.engine.stop import StopStrings
from specdec.engine.validate import check_engine_args, check_request, check_step_args
from specdec.model.load import Model
from specdec.model.segments import Segment
from specdec.sampling import SamplingParams, process_logits
from specdec.verify import VerifyResult, verify_tree_greedy, verify_tree_sampling, verify_typical
from specdec.verify.common import check_logits

MAX_CACHED_CONFIGS = 8  # drafter sets kept for distinct SpecConfigs (overrides make new ones; each may hold a cache)

DrafterBuilder = Callable[[DrafterSpec, SpecConfig], Drafter]


class Engine:
    """Runs requests on one target model with the drafters a SpecConfig names."""

    def __init__(self, model: Model, spec: SpecConfig = SpecConfig(), max_len: int = 4096,
                 drafter_factory: DrafterBuilder | None = None, max_sequences: int = 1, prefix_cache: str = "off"):
        """max_len: context per sequence; max_sequences: sequences that can run at once (cache slots).
        drafter_factory(drafter_spec, spec) -> Drafter; default: the registry (`build_drafter`).
        prefix_cache: "off", "on" or "exact": whether a request reuses the rows earlier ones left for the same
        leading tokens, and how exactly (engine/prefix_cache.py)."""
        check_engine_args(max_len, max_sequences, spec)
        self.model = model
        self.spec = spec
        self.cache = model.transformer.new_cache(max_len, num_slots=max_sequences)
        self.prefix = PrefixCache(prefix_cache, self.cache)
        self._running: dict[int, Request] = {}  # slot -> the request admitted into it and not finished
        self.eos = set(model.tokenizer.eos_ids)
        # an answer's text leaves special tokens out (<|im_start|>, <end_of_turn>; their ids stay in token_ids),
        # as vLLM's skip_special_tokens and llama-server do by default; stop strings are looked for in that text
        self.skip_special = True
        self.grammar_drafts = True  # a request with a grammar drafts what it forces first (the grammar drafter)
        self.drafter_factory = drafter_factory or self.build_drafter
        self._pool = DrafterPool(lambda s: [self.drafter_factory(d, s) for d in s.drafters], MAX_CACHED_CONFIGS)
        self.draft_models = DraftModels(model)  # draft-simple's models, loaded once per engine
        self._forward_cost: list[float] | None = None  # measured on first adaptive request
        self.clock = StepClock()  # what a plain decode step costs here: every request's verdict reads it

    def forward_cost(self, max_tokens: int) -> list[float]:
        """Measured seconds of one exact forward of t tokens, t = 0..max_tokens (cached)."""
        max_tokens = widest_forward(max_tokens, self.cache.max_len)  # so that a short context measures once
        if self._forward_cost is None or len(self._forward_cost) < max_tokens + 1:
            # a cache of its own: every slot of the engine's may be running a sequence
            scratch = self.model.transformer.new_cache(self.cache.max_len)
            self._forward_cost = measure_forward_cost(self.model.transformer, scratch, max_tokens)
        return self._forward_cost

    # -- drafters ----------------------------------------------------------------------------
    def drafters_for(self, spec: SpecConfig) -> list[Drafter]:
        """The first drafter set `spec` runs (built now if needed), for checks and reports. Sets are
        kept per distinct SpecConfig (the whole frozen settings object is the key: another draft
        length or tree shape is another set), one per sequence running at the same time."""
        return self._pool.first(spec)

    def build_drafter(self, drafter: DrafterSpec, spec: SpecConfig) -> Drafter:
        """A drafter from the registry, with the settings of `spec` a model drafter reads."""
        if spec.tree_topk > 1 and not self.model.transformer.exact_trees:
            why = getattr(self.model.transformer, "chains_only", None) or (
                f"the target runs on {self.model.info.device}, where tree rows would not be bitwise their paths' "
                "single steps")
            raise ValueError(f"--spec-tree-topk {spec.tree_topk}: {why}, so specdec verifies chains only; use "
                             "--spec-tree-topk 1")
        ctx = BuildContext(self.model, self.cache.max_len, spec.draft_model, spec.draft_p_min, spec.cross_tokenizer,
                           spec.tree_topk, spec.effective_tree_budget, self.draft_models.load)
        return registry.create(drafter, ctx)

    # -- request lifecycle -------------------------------------------------------------------
    def admit(self, prompt: Sequence[int], sampling: SamplingParams = SamplingParams(), max_tokens: int = 128,
              stop: Sequence[str] = (), spec: SpecConfig | None = None, skip_special: bool | None = None,
              logprobs: int | None = None) -> Request:
        """Check a request and give it a cache slot and a drafter set; step_batch prefills it. skip_special:
        whether its text leaves special tokens out (None: Engine.skip_special), stop strings looked for in it.
        logprobs: None, or n: record each emitted token's log-probability and its row's n most likely tokens
        (req.logprobs, engine/logprobs.py). With the prefix cache on, the slot may hold the prompt's first
        tokens already (req.cached_tokens); step_batch prefills the rest.

        Raises TypeError or ValueError for a bad request, before a cache slot is taken (engine/validate.py), and
        RuntimeError when every cache slot is in use.
        """
        spec = self.spec if spec is None else spec
        prompt, stop = check_request(prompt, sampling, max_tokens, stop, spec, self.cache.max_len,
                                     self.model.config.vocab_size)
        check_top_logprobs(logprobs)
        if sampling.grammar is not None and self.grammar_drafts:
            spec = with_grammar_drafter(spec)
        generator = sampling.generator()
        # a drafter that reads the target's hidden states needs them at every prompt position: a cold start
        reuse = not any(d.hidden_layers for d in self._pool.first(spec))
        slot, cached = self.prefix.take_slot(prompt, self._running, reuse)
        try:
            drafters = self._pool.acquire(spec)
        except BaseException:
            self.cache.release(slot)
            raise
        policy = DraftLengthPolicy(spec.draft_n_max, spec.draft_n_min, spec.adaptive and spec.enabled,
                                   self.forward_cost, bool(drafters) and all(d.cost_per_pass for d in drafters))
        skip_special = self.skip_special if skip_special is None else bool(skip_special)
        stop = StopStrings(self.model.tokenizer, tuple(stop), skip_special) if stop else None
        req = Request(prompt, sampling, max_tokens, stop, spec, slot, drafters, generator, policy,
                      skip_special=skip_special, stats=SpecStats(method=spec.method),
                      hidden_layers=tuple(sorted({i for d in drafters for i in d.hidden_layers})),
                      prefilled=cached, cached_tokens=cached, want_logprobs=logprobs)
        self._running[slot] = req
        try:
            policy.reset()
            if sampling.grammar is not None:
                req.constraint = Constraint(sampling.grammar, req.stats)
            for d in drafters:
                d.begin(prompt, sampling, req.generator)
        except BaseException:
            self.finish(req)
            raise
        return req

    def start(self, prompt: Sequence[int], sampling: SamplingParams = SamplingParams(), max_tokens: int = 128,
              stop: Sequence[str] = (), spec: SpecConfig | None = None) -> Request:
        """Admit a request, prefill its whole prompt in one forward and emit the first token."""
        req = self.admit(prompt, sampling, max_tokens, stop, spec)
        try:
            self.step_batch([req])
        except BaseException:
            self.finish(req)
            raise
        return req

    def step(self, req: Request) -> list[int]:
        """One draft -> verify -> commit round; returns the newly emitted tokens."""
        return self.step_batch([req])[0]

    def step_batch(self, reqs: Sequence[Request], prefill_chunk: int | None = None,
                   draft_caps: Sequence[int] | None = None) -> list[list[int]]:
        """One target forward for all of `reqs`; returns each request's newly emitted tokens.

        A request still prefilling brings its next `prefill_chunk` prompt tokens (None: the rest of
        the prompt) and emits its first token with the last chunk. The others bring their last token
        plus a draft of at most draft_caps[i] tokens (default: the request's own draft length),
        verified, accepted and rolled back each on its own. Finished requests bring nothing.

        When a request's commit raises, the requests not yet committed get the step's rows taken out of
        their caches again and may go on; the one that raised must be finished (its drafters have heard of
        the step). Those committed before it keep their new tokens in req.output.
        """
        t0 = time.perf_counter()
        plans = []
        check_step_args(reqs, prefill_chunk)
        for i, req in enumerate(reqs):
            if req.finished:
                plans.append(None)
            elif req.prefilled < len(req.prompt):
                plans.append(self._plan_prefill(req, prefill_chunk))
            else:
                cap = req.draft_policy.next_length()
                plans.append(self._plan_step(req, cap if draft_caps is None else min(cap, draft_caps[i])))
        live = [p for p in plans if p is not None]
        t1 = time.perf_counter()
        layers = tuple(sorted({h for p in live for h in p.req.hidden_layers}))
        before = [self.cache.lengths[p.req.slot] for p in live]
        committed = 0
        try:
            outs = self.model.transformer.forward_batch([p.segment for p in live], self.cache, hidden_layers=layers)
            for plan, out in zip(live, outs):
                plan.new = self._commit(plan, out)
                committed += 1
        except BaseException:  # the forward wrote every request's rows: those not committed are taken out again,
            # so that a request stepped on after another's failure continues from what it emitted
            for plan, length in zip(live[committed:], before[committed:]):
                self.cache.truncate(plan.req.slot, length)
            raise
        t3 = time.perf_counter()
        for plan in live:  # every request in the step waited for all of it
            if plan.draft is None:
                plan.req.prefill_s += t3 - t0
            else:
                plan.req.stats.verify_s += t3 - t1 - plan.rollback_s
                plan.req.decode_s += t3 - t0
                self.clock.step(plan.req.stats, len(plan.draft), t3 - t0, plan.draft_s, plan.start, len(live) == 1)
        return [[] if p is None else p.new for p in plans]

    def finish(self, req: Request) -> None:
        """Free the request's cache slot, let its drafters learn from its output and give them back."""
        if req.slot >= 0:
            self._running.pop(req.slot, None)
            self.prefix.release(req)  # its rows stay for later requests when the prefix cache is on
            req.slot = -1
            context = len(req.prompt) + len(req.output) // 2  # the mean context of its decode steps
            self.clock.settle(req.stats, req.decode_s, max(len(req.output) - 1 + req.ended_on_eos, 0), context,
                              lambda: self.forward_cost(1))  # measured only where nothing else prices a step
            try:
                for d in req.drafters:
                    d.end(req.output)
            finally:
                self._pool.release(req.spec, req.drafters)

    def stream(self, prompt, sampling=SamplingParams(), max_tokens=128, stop=(), spec=None) -> Iterator[list[int]]:
        """Yields lists of new token ids as they are committed; the last value of `req` holds the stats."""
        req = self.start(prompt, sampling, max_tokens, stop, spec)
        try:
            yield req.output[:]
            while not req.finished:
                new = self.step(req)
                if new:
                    yield new
        finally:
            self.finish(req)
        self.last_request = req

    def generate(self, prompt, sampling=SamplingParams(), max_tokens=128, stop=(), spec=None) -> GenerationResult:
        req = self.start(prompt, sampling, max_tokens, stop, spec)
        try:
            while not req.finished:
                self.step(req)
        finally:
            self.finish(req)
        return self.result(req)

    def result(self, req: Request) -> GenerationResult:
        text = req.stop_text if req.stop_text is not None else self.model.tokenizer.decode(req.output,
                                                                                             req.skip_special)
        return GenerationResult(req.output, text, req.finish_reason or "length", len(req.prompt), req.stats,
                                req.prefill_s, req.decode_s, req.ended_on_eos, req.sources,
                                ("target", *(d.name for d in req.drafters)), req.cached_tokens,
                                req.logprobs if req.want_logprobs is not None else None)

    # -- internals ---------------------------------------------------------------------------
    def _plan_prefill(self, req: Request, chunk: int | None) -> Plan:
        end = len(req.prompt) if chunk is None else min(len(req.prompt), req.prefilled + chunk)
        tokens = req.prompt[req.prefilled : end]
        # prefix cache "exact": decode's numerics, so that a row's bits depend on the tokens before it alone
        segment = Segment(torch.tensor(tokens), req.slot, exact=self.prefix.exact_prefill, last_only=True)
        return Plan(req, segment, tokens)

    def _plan_step(self, req: Request, cap: int) -> Plan:
        t0 = time.perf_counter()
        start = self.cache.lengths[req.slot]
        room = min(req.max_tokens - len(req.output) - 1, self.cache.max_len - start - 2)
        k = max(0, min(cap, room))
        drafter, draft = self._propose(req, k)
        if not len(draft) and req.drafters:  # why this step drafted nothing, for the request's verdict
            req.stats.paused_steps += k == 0 and req.draft_policy.length == 0
            req.stats.empty_steps += k > 0
        if start + 1 + len(draft) > self.cache.max_len:
            drafter, draft = None, Draft()  # the tree does not fit in the context left: no draft, no feedback
        ids = [req.output[-1], *draft.tokens]  # the last committed token, then the tree's nodes
        positions, mask = tree_layout(draft.tree, start)
        segment = Segment(torch.tensor(ids), req.slot, positions, mask)
        # no drafters, nothing asked: planning is plain decoding's own work, not drafting
        return Plan(req, segment, ids, draft, drafter, start, time.perf_counter() - t0 if req.drafters else 0.0)

    def _commit(self, plan: Plan, out) -> list[int]:
        """Verify, roll back and emit after the forward: out.logits (1, T, V), out.hidden {layer: (1, T, H)}."""
        req = plan.req
        if plan.draft is None:  # a prefill chunk
            rows = list(range(len(plan.tokens)))
            req.prefilled += len(plan.tokens)
            if req.prefilled < len(req.prompt):
                self._feed_hidden(req, out.hidden, rows, plan.tokens)
                return []
            first = self._verify(req, out.logits[0], Draft())
            self._feed_hidden(req, out.hidden, rows, plan.tokens)
            return self._emit(req, first.tokens, (0,))
        draft, drafter = plan.draft, plan.drafter
        result = self._verify(req, out.logits[0], draft)
        kept = [0] + [1 + i for i in result.accepted_path]  # rows of the forward that stay in the cache
        self._feed_hidden(req, out.hidden, kept, [plan.tokens[i] for i in kept])
        t0 = time.perf_counter()  # the rollback: rows of rejected nodes dropped, the drafter told what was kept
        self.cache.keep(req.slot, plan.start, kept)
        if drafter is not None:  # a step without a draft had nothing to roll back
            drafter.on_accept(result.num_accepted)
            plan.rollback_s = time.perf_counter() - t0
        req.stats.rollback_s += plan.rollback_s
        req.stats.record(drafter.name if drafter is not None else "", len(draft), result.num_accepted, draft.depth)
        req.stats.lossy |= result.lossy
        req.stats.draft_s += plan.draft_s
        req.draft_policy.update(len(draft), result.num_accepted, plan.draft_s, draft.depth, req.stats)
        source = 0 if drafter is None else 1 + req.drafters.index(drafter)  # Request.sources' codes
        return self._emit(req, result.tokens, (source,) * result.num_accepted + (0,))

    def _propose(self, req: Request, k: int) -> tuple[Drafter | None, Draft]:
        """The first draft of the request's drafters (n-gram kinds first) at least --spec-draft-n-min long (a
        tree: deep), and its drafter: a shorter one counts as none, and the next drafter is asked.

        A sampled draft (draft_probs: a model drafter at temperature > 0) is verified whatever its length:
        its length can depend on the tokens it drew (--spec-draft-p-min stops after a token whose next row
        is unsure), and dropping it for being short would verify only the drafts whose tokens made them
        long, a choice rejection sampling does not allow (the verified law would no longer be the target's)."""
        if k <= 0 or not req.drafters:
            return None, Draft()
        context = req.prompt + req.output
        for d in req.drafters:
            draft = d.propose(context, k)
            if req.constraint is not None:  # the nodes the grammar forbids are cut before the draft counts
                draft = req.constraint.cut(draft)
            depth = draft.depth  # a tree's positions, not its nodes, meet n_min
            if depth == 0 or (depth < req.spec.draft_n_min and draft.draft_probs is None):
                continue
            if depth > k:
                raise RuntimeError(f"drafter {d.name} proposed a draft {depth} deep, more than {k}")
            return d, draft
        return None, Draft()

    def _verify(self, req: Request, logits: torch.Tensor, draft: Draft) -> VerifyResult:
        # logits: (1 + len(draft), V); with a grammar, each row masked as plain decoding masks its position
        if req.constraint is not None:
            logits = req.constraint.mask(logits, draft)
        result = self._verify_rows(req, logits, draft)
        if req.constraint is not None:
            req.constraint.advance(result.tokens, self.eos)  # the grammar's state moves over what is emitted
        if req.want_logprobs is not None:  # from the rows just verified (masked); _emit keeps those it emits
            req.pending_logprobs = token_logprobs(logits, result, req.want_logprobs)
        return result

    def _verify_rows(self, req: Request, logits: torch.Tensor, draft: Draft) -> VerifyResult:
        # typical acceptance only runs on chains (SpecConfig checks)
        if req.sampling.greedy:
            return verify_tree_greedy(logits, draft.tree)
        check_logits("the target's logits", logits)  # as the greedy path checks them, before they are processed
        target_probs = process_logits(logits, req.sampling)
        if req.spec.acceptance == "typical" and len(draft) > 0:
            return verify_typical(target_probs, draft.tokens)
        return verify_tree_sampling(target_probs, draft.tree, draft.draft_probs, req.generator)

    def _feed_hidden(self, req: Request, hidden: dict, rows: list[int], tokens: list[int]) -> None:
        """Hand the target's hidden rows of newly committed tokens to the drafters that read them."""
        if not req.hidden_layers:
            return
        picked = {layer: h[0, rows] for layer, h in hidden.items()}  # {layer: (len(rows), H)}
        for d in req.drafters:
            if d.hidden_layers:
                d.on_target_hidden({layer: picked[layer] for layer in d.hidden_layers}, tokens)

    def _emit(self, req: Request, tokens: Sequence[int], sources: Sequence[int]) -> list[int]:
        """Append tokens one at a time, stopping exactly where plain decoding would; sources[i]: where
        tokens[i] came from (Request.sources)."""
        new = []
        for t, source in zip(tokens, sources):
            if t in self.eos:
                req.finished, req.finish_reason, req.ended_on_eos = True, "stop", True
                break
            req.output.append(t)
            req.sources.append(source)
            new.append(t)
            if req.stop is not None and (cut := req.stop.find(req.output)) is not None:
                req.stop_text = cut
                req.finished, req.finish_reason = True, "stop"
                break
            if len(req.output) >= req.max_tokens:
                req.finished, req.finish_reason = True, "length"
                break
            if len(req.prompt) + len(req.output) >= self.cache.max_len:  # prompt + answer fill the context, as
                req.finished, req.finish_reason = True, "length"  # vLLM's max_model_len counts them
                break
        if req.want_logprobs is not None:  # tokens was the last verify's: the first len(new) are emitted
            req.logprobs += req.pending_logprobs[: len(new)]
        return new
