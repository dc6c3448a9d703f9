"""Promise 2, for every row of the matrix: with sampling, the law of the output is the target's, with
drafts that are accepted at some steps and REJECTED at others, so that the recovered token (from the
residual distribution) is drawn too.

Exact, not statistical: on the tiny random target (vocabulary 512, temperature 1, top-k 2, 4 tokens)
every random draw of Engine.generate is enumerated (helpers/tree_law.py) and the law of the tokens it
emits is compared with plain decoding's, enumerated the same way. The drafts:

    model-free kinds     on a context the target loops in (helpers/drafts.looping_prompt); one-hot drafts
    draft-simple         the target's weights plus noise: its own probabilities, near the target's
    draft-simple-cross   the target's weights under a permuted tokenizer (drafts pass through text)
    MTP, EAGLE-3 heads   random, chains and 2-wide trees; DFlash, DSpark blocks: random
                         (a random head's logits get a bias towards the tokens the target can emit here:
                         alone they would never be accepted)
    grammar              under GRAMMAR_ROW (a letter then "=!" forced, or another token): its law is plain
                         sampling's under the same grammar (the constrained law, tests/lossless/
                         test_grammar_matrix.py), its forced drafts accepted on the letter's branches

Each case asserts the expected number of accepted drafts is strictly between 0 and its most (so both the
accept and the reject branch have probability), and a tree that a later sibling is kept with positive
probability (recursive rejection sampling over siblings ran). Drafts with their own probabilities match
the target's law to float32 rounding (~1e-8: min(1, target/draft) and the residual are float32 rows),
one-hot drafts exactly (they are verified with plain decoding's draws).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest

from helpers.distribution import engine_law, law_gap
from helpers.drafts import (Biased, likely_bias, looping_prompt, permuted_vocab_model, perturbed_hf_model,
                            random_block_model, random_mtp_head)
from helpers.matrix import MODEL_FREE, OPTIONS, ROWS
from helpers.tiny import EAGLE3_DRAFT_IDS, random_eagle3_head
from helpers.tree_law import exact_law
from specdec.drafters.block.drafter import BlockDrafter
from specdec.drafters.hidden import HiddenStateDrafter
from specdec.drafters.registry import DrafterSpec
from specdec.engine.config import SpecConfig
from specdec.engine.constrain import compile_for
from specdec.engine.engine import Engine
from specdec.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SAMPLING = dict(temperature=1.0, top_k=2)
TOLERANCE = 1e-6  # float32 rounding is ~1e-8; the bugs these tests catch move the law by 1e-3 or more
SHORT = [9, 10, 11, 12, 13]
MAX_LEN = 64
# the grammar row's: after SHORT the masked target samples a letter (then "=!" is forced: two drafts) or
# <unused109> (then nothing is), so the expected accepted count is strictly between 0 and its most
GRAMMAR_ROW = 'root ::= ([a-z] "=!" | "<unused109>") [^5=(]*'


@dataclass(frozen=True)
class Case:
    spec: SpecConfig
    prompt: list[int]
    max_tokens: int
    factory: Callable | None = None  # () -> a new drafter; None: the registry builds it
    grammar: object = None  # the requests' compiled grammar (sampling.grammar.Grammar); None: none


@pytest.fixture(scope="module")
def cases(tiny_model, tmp_path_factory):
    """row -> Case on the tiny target."""
    folder = tmp_path_factory.mktemp("law-drafts")
    perturbed = perturbed_hf_model(folder / "perturbed")
    permuted = permuted_vocab_model(folder / "permuted")
    vocab = tiny_model.config.vocab_size
    # the tokens the target can emit second and third after SHORT, where the first drafts are verified: a
    # random head's logits are pushed towards them
    likely = {t for seq in engine_law(tiny_model, SHORT, SamplingParams(**SAMPLING), depth=3) for t in seq[1:]}
    bias = likely_bias(tiny_model, likely)
    tr = tiny_model.transformer

    def hidden(kind: str, topk: int):
        def build():
            if kind == "mtp":
                head = random_mtp_head(tiny_model, Biased(tr.lm_head, bias), max_len=MAX_LEN)
            else:
                ids = sorted(set(EAGLE3_DRAFT_IDS.tolist()) | likely)
                head = random_eagle3_head(tiny_model, draft_ids=EAGLE3_DRAFT_IDS.new_tensor(ids))
                head.lm_head = Biased(head.lm_head, bias[ids])
            return HiddenStateDrafter(head, f"draft-{kind}", vocab, topk=topk, budget=4 if topk > 1 else 2,
                                      max_len=MAX_LEN)
        return build

    def block(layout: str, p_min: float):
        return lambda: BlockDrafter(random_block_model(tiny_model, layout, bias), f"draft-{layout}", vocab,
                                    p_min=p_min, max_len=MAX_LEN)

    loop = looping_prompt(tiny_model)
    out = {row: Case(SpecConfig(drafters=(DrafterSpec.of(row, **OPTIONS.get(row, {})),), draft_n_max=3), loop, 4)
           for row in MODEL_FREE}
    out["grammar"] = Case(SpecConfig(drafters=("grammar",), draft_n_max=3), SHORT, 4,
                          grammar=compile_for(tiny_model, "gbnf", GRAMMAR_ROW))
    out["draft-simple"] = Case(SpecConfig(drafters=("draft-simple",), draft_model=str(perturbed), draft_n_max=2), SHORT, 4)
    cat = tiny_model.tokenizer.encode("the cat sat on the mat")
    out["draft-simple-cross"] = Case(SpecConfig(drafters=("draft-simple",), draft_model=str(permuted),
                                                cross_tokenizer=True, draft_n_max=2), cat, 4)
    for kind in ("mtp", "eagle3"):
        out[f"draft-{kind}-chain"] = Case(SpecConfig(drafters=(f"draft-{kind}",), draft_n_max=2), SHORT, 4,
                                          hidden(kind, 1))
        out[f"draft-{kind}-tree"] = Case(SpecConfig(drafters=(f"draft-{kind}",), draft_n_max=2, tree_topk=2,
                                                    tree_budget=4), SHORT, 4, hidden(kind, 2))
    out["draft-dflash"] = Case(SpecConfig(drafters=("draft-dflash",), draft_n_max=2), SHORT, 4, block("dflash", 0.0))
    out["draft-dspark"] = Case(SpecConfig(drafters=("draft-dspark",), draft_n_max=2, draft_p_min=0.2), SHORT, 4,
                               block("dspark", 0.2))
    return out


@pytest.fixture(scope="module")
def plain_law(tiny_model):
    """(prompt, max_tokens, grammar) -> the exact law of plain sampling, enumerated once."""
    laws = {}

    def get(prompt: list[int], max_tokens: int, grammar=None):
        key = (tuple(prompt), max_tokens, grammar)
        if key not in laws:
            with pytest.MonkeyPatch.context() as patch:
                laws[key] = exact_law(patch, Engine(tiny_model, max_len=MAX_LEN), prompt, max_tokens=max_tokens,
                                      grammar=grammar, **SAMPLING).tokens
        return laws[key]

    return get


@pytest.mark.parametrize("row", list(ROWS))
def test_sampled_output_follows_the_target_law(row, tiny_model, cases, plain_law, monkeypatch):
    case = cases[row]
    engine = Engine(tiny_model, max_len=MAX_LEN)
    if case.factory is not None:
        engine.drafter_factory = lambda drafter_spec, spec: case.factory()
    law = exact_law(monkeypatch, engine, case.prompt, spec=case.spec, max_tokens=case.max_tokens, grammar=case.grammar,
                    **SAMPLING)
    most = case.max_tokens - 2  # the first token comes from the prefill, and each step emits one of its own
    assert 0 < law.accepted < most, f"{row}: E[accepted] = {law.accepted}: a branch of verification never ran"
    if case.spec.tree_topk > 1:
        assert law.later_sibling > 0, f"{row}: no later sibling is ever kept: the tree verified like a chain"
    gap = law_gap(law.tokens, plain_law(case.prompt, case.max_tokens, case.grammar))
    assert gap < TOLERANCE, f"{row}: the law of the output is {gap:.2e} off the target's"
