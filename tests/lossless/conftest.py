"""What the lossless matrix shares: the real target in its default weight format (smollm2-135m's GGUF
file, run on its own blocks), its plain greedy answers, and how each row of the matrix drafts for it.

Real drafters for smollm2: the model-free kinds; the MTP and EAGLE-3 heads shipped with specdec (chains
and trees); draft-simple with a random model sharing its tokenizer (rejected) and with the target as its
own draft (accepted); a tiny random model with a byte-level tokenizer as a cross-tokenizer draft; random
DFlash / DSpark folders (no trained ones exist for smollm2: they draft and are rejected, which is what
exercises verification); the grammar drafter with suffix, under a grammar that forces the first half of
each plain answer and allows any text after it (so plain's answer is the answer under the grammar too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest

from helpers.drafts import random_sharing_tokenizer, save_random_block_drafter
from helpers.grammars import forcing_prefix
from helpers.matrix import OPTIONS
from helpers.models import real_model
from helpers.prompts import EDIT_PROMPT
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.registry import DrafterSpec
from specdec.engine.config import SpecConfig
from specdec.engine.constrain import compile_for
from specdec.engine.engine import Engine
from specdec.sampling import SamplingParams

MAX_LEN = 512
ANSWER_TOKENS = 32  # plain answers are computed this long once; tests compare prefixes of them

# text that repeats, so that the model-free kinds draft; the answers leave the pattern after a while, so
# drafts are also rejected
ASSIGN_PROMPT = "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\ny = 2\nz ="
CAT_PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat sat on the"
PROMPTS = {"edit": EDIT_PROMPT, "assign": ASSIGN_PROMPT, "cat": CAT_PROMPT}


@dataclass(frozen=True)
class Variant:
    """One way a row drafts for the real target. factory(engine) -> drafter_factory, or None: the registry."""

    what: str
    spec: SpecConfig
    factory: Callable | None = None
    grammar: Callable | None = None  # (model, plain answer's ids) -> the request's grammar; None: no grammar

    def sampling(self, model, answer: list[int]) -> SamplingParams:
        """Greedy, with the row's grammar for a request whose plain greedy answer is `answer`."""
        return SamplingParams(grammar=None if self.grammar is None else self.grammar(model, answer))

    def engine(self, model, max_sequences: int = 1) -> Engine:
        engine = Engine(model, max_len=MAX_LEN, max_sequences=max_sequences)
        if self.factory is not None:
            engine.drafter_factory = self.factory(engine)
        return engine


@pytest.fixture(scope="session")
def gguf_smollm():
    """smollm2-135m in the default weight format: its GGUF file's own blocks."""
    return real_model("smollm2-135m", "gguf")


@pytest.fixture(scope="session")
def plain_answers(gguf_smollm):
    """prompt name -> (prompt ids, the plain greedy answer of ANSWER_TOKENS tokens)."""
    engine = Engine(gguf_smollm, max_len=MAX_LEN)
    tok = gguf_smollm.tokenizer
    out = {}
    for name, text in PROMPTS.items():
        ids = tok.encode(text)
        out[name] = ids, engine.generate(ids, SamplingParams(), max_tokens=ANSWER_TOKENS).token_ids
    return out


def _self_draft(engine: Engine):
    """draft-simple with the target itself as the draft model (its own cache): every draft is accepted."""

    def build(drafter_spec, spec):
        return DraftModelDrafter(engine.model, engine.model.config.vocab_size, spec.draft_p_min, engine.cache.max_len)

    return build


def _half_forced(model, answer: list[int]):
    text = model.tokenizer.decode(answer)
    return compile_for(model, "gbnf", forcing_prefix(text, len(text) // 2))


@pytest.fixture(scope="session")
def real_variants(gguf_smollm, tiny_hf_dir, tmp_path_factory):
    """row -> [Variant]: how each row of the matrix drafts for the real target."""
    folder = tmp_path_factory.mktemp("lossless-real")
    random_draft = random_sharing_tokenizer(folder / "random-smollm", gguf_smollm)
    blocks = {layout: save_random_block_drafter(gguf_smollm, layout, folder / layout)
              for layout in ("dflash", "dspark")}
    free = {kind: [Variant(kind, SpecConfig(drafters=(DrafterSpec.of(kind, **OPTIONS.get(kind, {})),),
                                            draft_n_max=4))]
            for kind in ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache", "suffix")}
    heads = {f"draft-{kind}-{shape}": [Variant(f"the shipped {kind} head, {shape}", SpecConfig(
        drafters=(f"draft-{kind}",), draft_n_max=3, **({"tree_topk": 2, "tree_budget": 5} if shape == "tree" else {})))]
        for kind in ("mtp", "eagle3") for shape in ("chain", "tree")}
    variants = {
        **free,
        "draft-simple": [
            Variant("a random draft with smollm2's tokenizer",
                    SpecConfig(drafters=("draft-simple",), draft_model=str(random_draft), draft_n_max=3)),
            Variant("the target as its own draft",
                    SpecConfig(drafters=("draft-simple",), draft_model="smollm2-135m", draft_n_max=3), _self_draft),
        ],
        "draft-simple-cross": [Variant("a tiny random draft with a byte-level tokenizer", SpecConfig(
            drafters=("draft-simple",), draft_model=str(tiny_hf_dir), cross_tokenizer=True, draft_n_max=3))],
        **heads,
        "grammar": [Variant("the grammar forcing half of each answer, then suffix", SpecConfig(
            drafters=("grammar", "suffix"), draft_n_max=4), grammar=_half_forced)],
        **{f"draft-{layout}": [Variant(f"a random {layout} folder", SpecConfig(
            drafters=(f"draft-{layout}",), draft_model=str(path), draft_n_max=3))] for layout, path in blocks.items()},
    }
    return variants.__getitem__
