"""The lossless matrix under a grammar (constrained decoding, engine/constrain.py), for every row, on the tiny
random target (vocabulary 512, byte-level: it spells JSON):

1. greedy: under a JSON schema, greedy speculative output is plain greedy output under the same schema, token
   for token; the row's own drafter drafts (the grammar drafter is off except in its own row), some of its
   drafts are cut where the grammar forbids a token, and verified drafts are accepted and rejected;
2. law: with sampling (temperature 1, top-k 2, 4 tokens) under a GBNF grammar that forbids tokens the target
   would otherwise sample, the exact law of the output (every random draw enumerated, helpers/tree_law.py)
   is the masked and renormalised target law worked out without the engine (helpers/grammars.py); drafts
   are accepted at some steps and rejected at others (the grammar row's forced drafts: accepted).

The drafts are the law matrix's (tests/lossless/test_law_matrix.py): model-free kinds on contexts they find
repeats in, a perturbed and a permuted copy of the target as draft models, random MTP, EAGLE-3 and block
heads whose logits lean towards the tokens the constrained target emits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest

from helpers.drafts import (Biased, likely_bias, looping_prompt, permuted_vocab_model, perturbed_hf_model,
                            random_block_model, random_mtp_head)
from helpers.grammars import EXAMPLE, SCHEMA_TEXT, BiasedDraftModel, constrained_law
from helpers.matrix import MODEL_FREE, OPTIONS, ROWS
from helpers.tiny import EAGLE3_DRAFT_IDS, random_eagle3_head
from helpers.tree_law import exact_law
from helpers.distribution import law_gap
from specdec.drafters.base import Draft, DrafterBase
from specdec.drafters.block.drafter import BlockDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.hidden import HiddenStateDrafter
from specdec.drafters.registry import DrafterSpec
from specdec.engine.config import SpecConfig
from specdec.engine.constrain import compile_for
from specdec.engine.engine import Engine
from specdec.model.load import load_model
from specdec.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MAX_LEN = 256
GREEDY_TOKENS = 64  # the whole object: every key, value kind and the end of the answer
SAMPLING = dict(temperature=1.0, top_k=2)
LAW_TOKENS = 4
TOLERANCE = 1e-6  # as the law matrix's: float32 rounding is ~1e-8
SHORT = [9, 10, 11, 12, 13]
# no "5" and no byte that cannot start a UTF-8 character: the tiny target's likeliest tokens after the law
# contexts include <unused225> and such bytes, so the mask changes its law
LAW_GRAMMAR = 'root ::= ([^5=(] | "=!" | "(a")*'
# the grammar row's: one letter (one token), then "=!" forced (no token of the tiny vocabulary starts with "=" or
# "!" but those two, so the forced bytes are forced tokens: the grammar drafter drafts both), then free text
FORCED_GRAMMAR = 'root ::= [a-z] "=!" [^5=(]*'


@dataclass(frozen=True)
class Row:
    spec: SpecConfig
    factory: Callable | None = None  # () -> a new drafter; None: the registry builds it


def rows(model, folder, likely: set[int]) -> dict[str, Row]:
    """row -> how it drafts on the tiny target; model heads lean towards `likely` tokens."""
    vocab = model.config.vocab_size
    bias = likely_bias(model, likely)
    tr = model.transformer

    def hidden(kind: str, topk: int):
        def build():
            if kind == "mtp":
                head = random_mtp_head(model, Biased(tr.lm_head, bias), max_len=MAX_LEN)
            else:
                ids = sorted(set(EAGLE3_DRAFT_IDS.tolist()) | likely)
                head = random_eagle3_head(model, draft_ids=EAGLE3_DRAFT_IDS.new_tensor(ids))
                head.lm_head = Biased(head.lm_head, bias[ids])
            return HiddenStateDrafter(head, f"draft-{kind}", vocab, topk=topk, budget=4 if topk > 1 else 3,
                                      max_len=MAX_LEN)
        return build

    def block(layout: str):
        return lambda: BlockDrafter(random_block_model(model, layout, bias), f"draft-{layout}", vocab, max_len=MAX_LEN)

    out = {row: Row(SpecConfig(drafters=(DrafterSpec.of(row, **OPTIONS.get(row, {})),), draft_n_max=3))
           for row in MODEL_FREE}
    draft_model = lambda: BiasedDraftModel(load_model(str(folder["perturbed"]), "fp32", progress=False), bias)
    out["draft-simple"] = Row(SpecConfig(drafters=("draft-simple",), draft_model=str(folder["perturbed"]),
                                         draft_n_max=3), lambda: DraftModelDrafter(draft_model(), vocab, 0.0, MAX_LEN))
    out["draft-simple-cross"] = Row(SpecConfig(drafters=("draft-simple",), draft_model=str(folder["permuted"]),
                                               cross_tokenizer=True, draft_n_max=3))
    for kind in ("mtp", "eagle3"):
        out[f"draft-{kind}-chain"] = Row(SpecConfig(drafters=(f"draft-{kind}",), draft_n_max=3), hidden(kind, 1))
        out[f"draft-{kind}-tree"] = Row(SpecConfig(drafters=(f"draft-{kind}",), draft_n_max=2, tree_topk=2,
                                                   tree_budget=4), hidden(kind, 2))
    for layout in ("dflash", "dspark"):
        out[f"draft-{layout}"] = Row(SpecConfig(drafters=(f"draft-{layout}",), draft_n_max=3), block(layout))
    assert set(out) == set(ROWS), f"rows without a grammar case: {sorted(set(ROWS) - set(out))}"
    return out


def engine_for(model, row: Row, grammar_drafts: bool) -> Engine:
    engine = Engine(model, max_len=MAX_LEN)
    engine.grammar_drafts = grammar_drafts
    if row.factory is not None:
        engine.drafter_factory = lambda drafter_spec, spec: row.factory()
    return engine


@pytest.fixture(scope="module")
def draft_folders(tmp_path_factory):
    folder = tmp_path_factory.mktemp("grammar-drafts")
    return {"perturbed": perturbed_hf_model(folder / "perturbed"),
            "permuted": permuted_vocab_model(folder / "permuted")}


# -- greedy ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def greedy_case(tiny_model, draft_folders):
    """(prompt, the schema, its plain greedy answer, the rows) for the greedy test."""
    prompt = tiny_model.tokenizer.encode(f"{EXAMPLE}\n{EXAMPLE}\n", add_bos=False)
    schema = compile_for(tiny_model, "json_schema", SCHEMA_TEXT)
    plain = Engine(tiny_model, max_len=MAX_LEN).generate(prompt, SamplingParams(grammar=schema), GREEDY_TOKENS)
    return prompt, schema, plain.token_ids, rows(tiny_model, draft_folders, set(plain.token_ids))


@pytest.mark.parametrize("row", list(ROWS))
def test_greedy_output_under_a_schema_is_plain_greedy_output(row, tiny_model, greedy_case):
    prompt, schema, plain, cases = greedy_case
    case = cases[row]
    kind = ROWS[row]
    engine = engine_for(tiny_model, case, grammar_drafts=row == "grammar")
    out = engine.generate(prompt, SamplingParams(grammar=schema), GREEDY_TOKENS, spec=case.spec)
    assert out.token_ids == plain, f"{row} changed the answer under the schema"
    mine = out.stats.by_drafter.get(kind)
    assert mine is not None and mine.drafted > 0, f"{row} never had a draft verified: this test would prove nothing"
    if row == "grammar":  # forced tokens: the tiny vocabulary spells them one way only
        assert mine.accepted == mine.drafted
    else:
        assert out.stats.grammar_cut > 0 or mine.accepted < mine.drafted, f"{row}: nothing was cut or rejected"


def test_the_greedy_cases_cut_accept_and_reject(tiny_model, greedy_case):
    """Across the rows, drafts are cut by the grammar, and verified drafts accepted and rejected."""
    prompt, schema, plain, cases = greedy_case
    cut = accepted = rejected = 0
    for row in ("ngram-simple", "suffix", "draft-simple", "draft-mtp-tree"):
        out = engine_for(tiny_model, cases[row], False).generate(prompt, SamplingParams(grammar=schema),
                                                                GREEDY_TOKENS, spec=cases[row].spec)
        cut += out.stats.grammar_cut
        accepted += out.stats.accepted
        rejected += out.stats.drafted - out.stats.accepted
    assert cut > 0 and accepted > 0 and rejected > 0, (cut, accepted, rejected)


# -- law ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def law_case(tiny_model, draft_folders):
    """(prompt of each row, grammar of each row, the reference law of each (prompt, grammar), the rows)."""
    compiled = {text: compile_for(tiny_model, "gbnf", text) for text in (LAW_GRAMMAR, FORCED_GRAMMAR)}
    loop = looping_prompt(tiny_model)
    cat = tiny_model.tokenizer.encode("the cat sat on the mat", add_bos=False)
    prompts = {row: loop if row in MODEL_FREE else cat if row == "draft-simple-cross" else SHORT for row in ROWS}
    grammars = {row: compiled[FORCED_GRAMMAR if row == "grammar" else LAW_GRAMMAR] for row in ROWS}
    laws = {}
    for row in ROWS:
        key = (tuple(prompts[row]), grammars[row].text)
        if key not in laws:
            laws[key] = constrained_law(tiny_model, prompts[row], SamplingParams(**SAMPLING), grammars[row], LAW_TOKENS)
    # the tokens the constrained target can emit second after SHORT, where the heads' first drafts are verified
    likely = {t for seq in laws[(tuple(SHORT), LAW_GRAMMAR)] for t in seq[1:2]}
    return prompts, grammars, laws, rows(tiny_model, draft_folders, likely)


def test_the_grammar_changes_the_law(tiny_model, law_case):
    """The reference law under each grammar is not the unconstrained one (else the law test would not see a
    missing mask)."""
    prompts, grammars, laws, _ = law_case
    for (prompt, text), law in laws.items():
        free = constrained_law(tiny_model, list(prompt), SamplingParams(**SAMPLING), None, LAW_TOKENS)
        assert law_gap(free, law) > 0.01, text


@pytest.mark.parametrize("row", list(ROWS))
def test_sampled_output_under_a_grammar_follows_the_constrained_law(row, tiny_model, law_case, monkeypatch):
    prompts, grammars, laws, cases = law_case
    case = cases[row]
    engine = engine_for(tiny_model, case, grammar_drafts=row == "grammar")
    law = exact_law(monkeypatch, engine, prompts[row], spec=case.spec, max_tokens=LAW_TOKENS, grammar=grammars[row],
                    **SAMPLING)
    gap = law_gap(law.tokens, laws[(tuple(prompts[row]), grammars[row].text)])
    assert gap < TOLERANCE, f"{row}: the law of the output is {gap:.2e} off the constrained target's"
    most = LAW_TOKENS - 2
    if row == "grammar":  # "=!" after the first token: both drafted, and forced, so accepted on every branch
        assert law.accepted == most, f"the grammar drafter's forced drafts: E[accepted] = {law.accepted}, not {most}"
    else:
        assert 0 < law.accepted < most, f"{row}: E[accepted] = {law.accepted}: a branch of verification never ran"


def test_plain_sampling_follows_the_constrained_law(tiny_model, law_case, monkeypatch):
    """Plain decoding under the grammar is the reference law too (the masks of a step without a draft)."""
    prompts, grammars, laws, _ = law_case
    prompt, grammar = prompts["draft-simple"], grammars["draft-simple"]
    law = exact_law(monkeypatch, Engine(tiny_model, max_len=MAX_LEN), prompt, max_tokens=LAW_TOKENS, grammar=grammar,
                    **SAMPLING)
    assert law_gap(law.tokens, laws[(tuple(prompt), grammar.text)]) < TOLERANCE


class _Ending(DrafterBase):
    """Drafts the plain constrained answer exactly, then the end of the answer, then a token past it: the
    draft that closes the object and ends the answer in one verification (what suffix drafting does on an
    agent's repeated JSON)."""

    name = "ending"

    def __init__(self, prompt: list[int], answer: list[int], eos: int):
        self.prompt, self.tail, self.eos, self.ended = prompt, list(answer) + [eos, eos], eos, 0

    def propose(self, context, draft_length: int) -> Draft:
        done = len(context) - len(self.prompt)
        tokens = self.tail[done : done + draft_length]
        self.ended += self.eos in tokens
        return Draft.chain(tokens)


@pytest.mark.parametrize("draft_length", [4, 5])
def test_a_draft_that_ends_the_answer_keeps_it(tiny_model, greedy_case, draft_length):
    prompt, schema, plain, _ = greedy_case
    assert len(plain) < GREEDY_TOKENS, "the plain answer must end under the schema for this test to mean anything"
    drafter = _Ending(prompt, plain, tiny_model.tokenizer.eos_ids[0])
    spec = SpecConfig(drafters=("suffix",), draft_n_max=draft_length, draft_n_min=1)
    engine = Engine(tiny_model, spec, max_len=MAX_LEN, drafter_factory=lambda drafter_spec, spec: drafter)
    engine.grammar_drafts = False
    out = engine.generate(prompt, SamplingParams(grammar=schema), GREEDY_TOKENS, spec=spec)
    assert out.token_ids == plain and out.finish_reason == "stop"
    assert drafter.ended > 0, "no draft held the end of the answer: this test would prove nothing"
    assert out.stats.accepted == out.stats.drafted  # every draft verified whole, up to the end
