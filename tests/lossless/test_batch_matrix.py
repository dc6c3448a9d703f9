"""Promise 3, for every row of the matrix: requests that run together give their solo greedy answers,
bitwise.

Through Engine.step_batch on the real smollm2-135m (GGUF blocks): three requests of the row's kind with
different prompts and answer lengths, each with its own drafter set; the third joins after two steps and
prefills its prompt in the forward that verifies the others' drafts. Each answer must be the plain
greedy answer (which promise 1 holds the solo speculative answer to).

Prompts are prefilled whole here, as generate prefills them: a prefill's GEMMs on quantized weights have
bits that depend on their row count (QLinear.prefill), so a prompt prefilled in other chunks may get
another answer (on smollm2's GGUF blocks this one does); the scheduler's test below prefills in chunks.

Through the server's Scheduler on the tiny model, for a few kinds: jobs joining as others finish stream
exactly the text they give alone."""

from __future__ import annotations

import asyncio

import pytest

from helpers.drafts import looping_prompt, perturbed_hf_model, save_random_block_drafter
from helpers.matrix import OPTIONS, ROWS
from specdec.drafters.registry import DrafterSpec
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.sampling import SamplingParams
from specdec.server.scheduler import Scheduler
from specdec.server.jobs import Delta, Done, Job

# (prompt name, answer tokens, step at which the request joins)
BATCH = [("edit", 16, 0), ("assign", 10, 0), ("cat", 12, 2)]


@pytest.mark.slow
@pytest.mark.parametrize("row", list(ROWS))
def test_batched_requests_give_their_solo_answers(row, gguf_smollm, plain_answers, real_variants):
    drafted = 0
    for variant in real_variants(row):
        engine = variant.engine(gguf_smollm, max_sequences=len(BATCH))
        reqs: dict[str, object] = {}
        for step in range(200):
            for name, n, joins in BATCH:
                if joins == step:
                    ids, plain = plain_answers[name]
                    reqs[name] = engine.admit(ids, variant.sampling(gguf_smollm, plain[:n]), n, spec=variant.spec)
            if len(reqs) == len(BATCH) and all(r.finished for r in reqs.values()):
                break
            engine.step_batch(list(reqs.values()))
        for name, n, _ in BATCH:
            engine.finish(reqs[name])
            assert reqs[name].output == plain_answers[name][1][:n], \
                f"{row} ({variant.what}): the {name} request's answer changed in the batch"
            drafted += reqs[name].stats.drafted
        assert sorted(engine.cache.free_slots) == list(range(len(BATCH)))
    assert drafted > 0, f"{row} never drafted in the batch: this test would prove nothing"


# -- the server's scheduler, on the tiny model --------------------------------------------------------
def jobs(loop: list[int]) -> list[tuple[list[int], int]]:
    """(prompt, answer tokens) of five jobs: four in a context the tiny model loops in, one outside it."""
    return [(loop[-12:], 10), (loop[-5:], 6), (loop[-30:], 12), ([5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7], 8),
            (loop[-9:], 9)]


def run_jobs(scheduler: Scheduler, spec: SpecConfig, work) -> dict[int, tuple[Done, str]]:
    """Submit the jobs at once (greedy, streamed); returns {index: (Done, streamed text)}."""

    async def main():
        loop = asyncio.get_running_loop()
        jobs = [Job(prompt, SamplingParams(), n, (), spec, stream=True, endpoint="completions", loop=loop)
                for prompt, n in work]
        for job in jobs:
            scheduler.submit(job)

        async def drain(job):
            deltas = []
            while True:
                event = await asyncio.wait_for(job.events.get(), 60)
                if isinstance(event, Done):
                    return event, "".join(deltas)
                assert isinstance(event, Delta), event
                deltas.append(event.text)

        return dict(enumerate(await asyncio.gather(*(drain(j) for j in jobs))))

    return asyncio.run(main())


@pytest.fixture(scope="module")
def tiny_drafts(tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("scheduler-drafts")
    return {"draft-simple": perturbed_hf_model(folder / "perturbed"),
            "draft-dflash": save_random_block_drafter(tiny_model, "dflash", folder / "dflash"),
            "loop": looping_prompt(tiny_model)}


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("row", ["ngram-map-k", "draft-simple", "draft-dflash"])
def test_scheduled_jobs_give_their_solo_answers(row, tiny_model, tiny_drafts):
    """Five jobs through a batch of 3 (they join as others finish; prompts longer than the prefill chunk)."""
    spec = SpecConfig(drafters=(DrafterSpec.of(ROWS[row], **OPTIONS.get(row, {})),),
                      draft_model=str(tiny_drafts[row]) if row.startswith("draft-") else None, draft_n_max=3)
    engine = Engine(tiny_model, spec, max_len=128, max_sequences=3)
    scheduler = Scheduler(engine, prefill_chunk=4)
    try:
        finished = run_jobs(scheduler, spec, jobs(tiny_drafts["loop"]))
    finally:
        scheduler.stop()
    drafted = 0
    for i, (prompt, n) in enumerate(jobs(tiny_drafts["loop"])):
        done, streamed = finished[i]
        alone = Engine(tiny_model, max_len=128).generate(prompt, SamplingParams(), n)
        assert (streamed + done.text, done.completion_tokens) == (alone.text, alone.completion_tokens), f"job {i}"
        drafted += done.stats.drafted
    assert drafted > 0, f"{row} never drafted: this test would prove nothing"
    assert sorted(engine.cache.free_slots) == [0, 1, 2]
