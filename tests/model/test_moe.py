"""Mixture-of-experts models (model/moe.py) against transformers, the independent reference, and through
llama.cpp's own conversion; routing that is row-invariant; speculative decoding that stays lossless on them.

The checkpoints (helpers/moe.py): tiny Qwen3-MoE and GLM-4.5 (glm4_moe: sigmoid scores, selection bias, shared
expert, routed scale, a dense first layer, partial rotary) written by transformers' own classes with random
weights; and the same checkpoints converted by llama.cpp's convert_hf_to_gguf.py (FIXTURE, committed: ffn_*_exps
stacks, expert_* metadata as llama.cpp writes them, not as specdec's writer would).

fp32 logits agree within 1e-4 of the largest logit; greedy tokens are identical; the gguf format (int8
activations, llama.cpp's scheme) keeps every argmax.
"""

from __future__ import annotations

import pytest
import torch

from helpers.distribution import law_gap
from helpers.drafts import looping_prompt
from helpers.oracle import assert_oracle_keeps_plain
from helpers.moe import (FAMILIES, FIXTURE, NO_TREE, convert_to_gguf, fixture_folder, llama_cpp_tree, reference,
                         transformers_folder)
from helpers.tree_law import exact_law
from specdec.drafters.base import Draft, DrafterBase
from specdec.drafters.registry import DrafterSpec
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.model import kernels
from specdec.model.load import load_model
from specdec.sampling import SamplingParams

TOKENS = [(7 * i + 3) % 270 for i in range(40)]  # the tiny vocabulary is 272
PROMPT = TOKENS[:10]
NO_GGUF_KERNEL = pytest.mark.skipif(kernels.gguf() is None, reason="no GGUF kernel here (no cc or no AVX2)")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def load(path, fmt: str):
    return load_model(str(path), fmt, progress=False, weight_cache=False)


def specdec_logits(model, tokens=TOKENS, exact=True) -> torch.Tensor:
    tr = model.transformer
    cache = tr.new_cache(256)
    return tr.forward(torch.tensor([tokens]), cache, [cache.allocate()], exact=exact).logits[0]  # (T, V)


def reference_logits(ref, tokens=TOKENS) -> torch.Tensor:
    with torch.no_grad():
        return ref(torch.tensor([tokens])).logits[0]  # (T, V)


def assert_logits_agree(ours: torch.Tensor, theirs: torch.Tensor, rel: float = 1e-4) -> None:
    scale = max(1.0, theirs.abs().max().item())
    err = (ours - theirs).abs().max().item()
    assert err <= rel * scale, f"max |specdec - transformers| = {err:.3e}, largest logit {scale:.2f}"
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def greedy_pair(model, ref, n: int = 16) -> tuple[list[int], list[int]]:
    """(specdec's plain greedy tokens, transformers' greedy tokens) after PROMPT, an EOS ending either run."""
    ours = Engine(model, max_len=256).generate(PROMPT, SamplingParams(), max_tokens=n).token_ids
    eos = sorted(model.tokenizer.eos_ids)
    theirs = ref.generate(torch.tensor([PROMPT]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                          pad_token_id=eos[0])[0, len(PROMPT):].tolist()
    return ours, theirs[:-1] if theirs and theirs[-1] in eos else theirs


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """family -> (the folder FIXTURE's file was converted from, transformers' model of it), built once."""
    made = {}

    def get(family: str):
        if family not in made:
            folder = fixture_folder(tmp_path_factory.mktemp(family) / "hf", family)
            made[family] = folder, reference(folder)
        return made[family]

    return get


# -- against transformers -----------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_a_folder_transformers_wrote_gives_its_logits_and_greedy_tokens(family, pair):
    folder, ref = pair(family)
    model = load(folder, "fp32")
    m = model.config.moe
    assert (m.experts, m.experts_per_token) == (8, 2)
    assert m.layers == ((1,) if family == "glm4_moe" else (0, 1))  # GLM's first layer stays dense
    if family == "glm4_moe":
        assert (m.scoring, m.score_bias, m.shared_intermediate, m.routed_scale) == ("sigmoid", True, 32, 2.5)
    theirs = reference_logits(ref)
    for exact in (True, False):  # verify rows and prefill spans
        assert_logits_agree(specdec_logits(model, exact=exact), theirs)
    ours, theirs_greedy = greedy_pair(model, ref)
    assert len(ours) == 16 and ours == theirs_greedy


def test_group_limited_choice_follows_transformers(tmp_path):
    """DeepSeek-style groups (n_group 4, topk_group 2): llama.cpp's glm4moe has none, so only the folder is read."""
    folder = transformers_folder(tmp_path / "glm", "glm4_moe", seed=3, n_group=4, topk_group=2)
    model = load(folder, "fp32")
    assert (model.config.moe.groups, model.config.moe.groups_used) == (4, 2)
    assert_logits_agree(specdec_logits(model), reference_logits(reference(folder)))


def test_qwens_dense_layers_follow_transformers(tmp_path):
    """mlp_only_layers and decoder_sparse_step 2 (llama.cpp's qwen3moe has no dense layers, so only the folder is
    read): layers 0 and 2 dense by the step, layer 3 by the list, layer 1 a mixture."""
    folder = transformers_folder(tmp_path / "qwen", "qwen3_moe", seed=4, num_hidden_layers=4, decoder_sparse_step=2,
                                 mlp_only_layers=[3])
    model = load(folder, "fp32")
    assert model.config.moe.layers == (1,)
    assert_logits_agree(specdec_logits(model), reference_logits(reference(folder)))


@pytest.mark.parametrize("family", FAMILIES)
def test_llama_cpps_conversion_gives_transformers_logits(family, pair):
    """llama.cpp's f16 file holds the folder's float16-valued weights exactly: its fp32 format is transformers'
    logits to fp32 rounding; metadata (expert_count, expert_used_count, leading_dense_block_count,
    expert_gating_func, expert_weights_scale ...) read as llama.cpp writes them."""
    folder, ref = pair(family)
    path = FIXTURE / f"{family}.gguf"
    from_file, from_folder = load(path, "fp32"), load(folder, "fp32")
    assert from_file.config.moe == from_folder.config.moe
    assert from_file.config.arch == {"qwen3_moe": "qwen3moe", "glm4_moe": "glm4moe"}[family]
    theirs = reference_logits(ref)
    assert_logits_agree(specdec_logits(from_file), theirs)
    assert_logits_agree(specdec_logits(from_file, exact=False), theirs)


@NO_GGUF_KERNEL
@pytest.mark.parametrize("family", FAMILIES)
def test_the_gguf_format_tracks_transformers_on_llama_cpps_file(family, pair):
    """The default format computes on the file's stacked expert blocks with int8 activations: verify rows keep
    every argmax of transformers' (measured: max |diff| 1.3e-3 of logits up to 3.6); a prefill's bfloat16 GEMMs
    (QLinear.prefill) move logits by up to 0.04, so there an argmax may differ only where transformers' top two
    are nearer than that (measured: one row per family, its top two 0.005 apart)."""
    folder, ref = pair(family)
    model = load(FIXTURE / f"{family}.gguf", "gguf")
    theirs = reference_logits(ref)
    ours = specdec_logits(model)
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    assert (ours - theirs).abs().max() < 0.005 * theirs.abs().max()
    prefill = specdec_logits(model, exact=False)
    assert (prefill - theirs).abs().max() < 0.03 * theirs.abs().max()
    picked = theirs.gather(1, prefill.argmax(-1, keepdim=True))[:, 0]
    assert (theirs.max(-1).values - picked).max() < 0.02, "a prefill argmax that is no near tie differs"
    ours, theirs_greedy = greedy_pair(model, ref)
    assert ours == theirs_greedy


@pytest.mark.parametrize("name", [*FAMILIES, "glm4_moe_mtp"])
def test_llama_cpps_converter_writes_what_the_fixture_holds(name, tmp_path):
    """The committed file is what this llama.cpp's converter writes today from the folder transformers writes
    again (tensor names, shapes, bytes, metadata keys)."""
    from gguf import GGUFReader

    tree = llama_cpp_tree()
    if tree is None:
        pytest.skip(f"{NO_TREE} (set LLAMA_CPP_DIR to its source tree, or LLAMA_CPP_BIN to its build/bin)")
    fresh = GGUFReader(convert_to_gguf(fixture_folder(tmp_path / "hf", name), tmp_path / "f16.gguf", tree=tree))
    kept = GGUFReader(FIXTURE / f"{name}.gguf")
    assert [(t.name, t.shape.tolist()) for t in fresh.tensors] == [(t.name, t.shape.tolist()) for t in kept.tensors]
    assert all((a.data == b.data).all() for a, b in zip(fresh.tensors, kept.tensors))
    skip = ("general.", "tokenizer.ggml.")
    assert {k for k in fresh.fields if not k.startswith(skip)} == {k for k in kept.fields if not k.startswith(skip)}


# -- routing is row-invariant -------------------------------------------------------------------------------
FORMATS = [pytest.param("gguf", marks=NO_GGUF_KERNEL), "int8", "fp32"]


@pytest.fixture(scope="module")
def models():
    """(family, format) -> the fixture file loaded in that format, once."""
    made = {}

    def get(family: str, fmt: str):
        if (family, fmt) not in made:
            made[family, fmt] = load(FIXTURE / f"{family}.gguf", fmt)
        return made[family, fmt]

    return get


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_row_verified_alone_equals_that_row_among_k(family, fmt, models):
    """After the same prefix, k = 6 rows verified in one forward give each row the bits of stepping it alone:
    routing, expert order and sums do not depend on which rows share the call. The layer itself too: each row
    of a mixture's input alone, and the rows shuffled."""
    model = models(family, fmt)
    tr = model.transformer
    prefix, rows = TOKENS[:12], TOKENS[12:18]

    def prefilled():
        cache = tr.new_cache(64)
        slot = cache.allocate()
        tr.forward(torch.tensor([prefix]), cache, [slot], exact=False)
        return cache, slot

    cache, slot = prefilled()
    together = tr.forward(torch.tensor([rows]), cache, [slot], exact=True).logits[0]
    cache, slot = prefilled()
    alone = torch.cat([tr.forward(torch.tensor([[t]]), cache, [slot], exact=True).logits[0] for t in rows])
    assert torch.equal(together, alone), f"max |diff| {(together - alone).abs().max():.3e}"

    # where a vectorized op's tail falls depends on the row count (torch's sigmoid over 6, 14 or 16 rows of 8
    # scores gives some element other bits than one row at a time): every count from 2 to 16
    moe = next(layer.moe for layer in tr.layers if getattr(layer, "moe", None) is not None)
    g = torch.Generator().manual_seed(0)
    for n in range(2, 17):
        h = torch.randn(n, model.config.hidden_size, generator=g)
        out = moe(h)
        assert torch.equal(out, torch.cat([moe(h[i : i + 1]) for i in range(n)])), f"{n} rows"
        perm = torch.randperm(n, generator=g)
        assert torch.equal(moe(h[perm]), out[perm]), f"{n} rows shuffled"
    ids, _ = moe.route(h)
    assert len(torch.unique(ids)) > 2, "every row chose the same experts: this test would prove little"


# -- speculative decoding stays lossless --------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["ngram-simple", "suffix"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_speculative_output_is_plain_output_alone_and_in_a_batch(family, kind, models):
    model = models(family, "gguf" if kernels.gguf() is not None else "int8")
    loop = looping_prompt(model, length=30)
    prompts = [(loop, 24), (loop[-12:], 16), (PROMPT, 12)]
    plain = [Engine(model, max_len=128).generate(p, SamplingParams(), max_tokens=n).token_ids for p, n in prompts]
    spec = SpecConfig(drafters=(DrafterSpec.of(kind),), draft_n_max=4)
    for (p, n), want in zip(prompts, plain):
        out = Engine(model, max_len=128).generate(p, SamplingParams(), max_tokens=n, spec=spec)
        assert out.token_ids == want, f"{kind} changed the greedy answer on {family}"
    # whether the random model's greedy text loops, so that these drafters draft and get accepted, depends on
    # the CPU's float rounding (on an AVX2-only EPYC qwen3_moe's did not); the Oracle's drafts are accepted
    # whole, in part and not at all on any machine
    assert_oracle_keeps_plain(model, loop, 24)

    engine = Engine(model, spec, max_len=128, max_sequences=len(prompts))
    reqs = [engine.admit(p, SamplingParams(), n, spec=spec) for p, n in prompts]
    for _ in range(200):
        if all(r.finished for r in reqs):
            break
        engine.step_batch(reqs)
    for r, want in zip(reqs, plain):
        engine.finish(r)
        assert r.output == want, f"{kind}: a batched request's answer changed on {family}"


class TargetsGreedyChain(DrafterBase):
    """One-hot drafts of the target's own greedy continuation (computed on the target): under top-k 2 sampling
    each is accepted with the target's top probability (~1/2), so both verification branches run often."""

    name = "ngram-simple"

    def __init__(self, model):
        self.model = model

    def propose(self, context, draft_length: int) -> Draft:
        tokens = list(context)
        for _ in range(draft_length):
            tokens.append(int(specdec_logits(self.model, tokens)[-1].argmax()))
        return Draft.chain(tokens[len(context):])


def test_sampled_output_follows_the_target_law(models, monkeypatch):
    """Exact: every random draw enumerated (helpers/tree_law.py) on the tiny Qwen3-MoE (its file's blocks where
    the kernel runs), one-hot drafts accepted at some steps and rejected at others; the law of 4 tokens is
    plain sampling's."""
    model = models("qwen3_moe", "gguf" if kernels.gguf() is not None else "int8")
    sampling = dict(temperature=1.0, top_k=2)
    spec = SpecConfig(drafters=("ngram-simple",), draft_n_max=2)
    engine = Engine(model, max_len=64)
    engine.drafter_factory = lambda drafter_spec, spec: TargetsGreedyChain(model)
    law = exact_law(monkeypatch, engine, PROMPT, spec=spec, max_tokens=4, **sampling)
    assert 0 < law.accepted < 2, f"E[accepted] = {law.accepted}: a branch of verification never ran"
    with pytest.MonkeyPatch.context() as patch:
        plain = exact_law(patch, Engine(model, max_len=64), PROMPT, max_tokens=4, **sampling).tokens
    assert law_gap(law.tokens, plain) < 1e-6
