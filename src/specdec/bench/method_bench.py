"""The method bench: the plain baseline, each method and the peers on the same prompts, in one process.

    results = bench(load_model("smollm2-135m"), "quick", "none,ngram-simple,auto", out_dir="bench-out")

Prompts and methods are checked, and every drafter loaded, before anything is measured; runner.py
runs the rounds, report.py writes results.json, report.md and the plots.
"""

from __future__ import annotations

from specdec.bench.methods import bench_engine, parse_methods
from specdec.bench.peers import HF_PEERS, HFModels, HFPeer, URLPeer
from specdec.bench.prompts import load_prompts, prompts_meta
from specdec.bench.provenance import artifact, runtime_info
from specdec.bench.report import write_all
from specdec.bench.results_file import check_bench_joins
from specdec.bench.runner import run_bench
from specdec.drafters.registry import DEFAULT_DRAFT_LENGTH
from specdec.engine.setup import context_size, note_capped_context
from specdec.model.catalogue import resolve

DEFAULT_METHODS = "none,ngram-simple,ngram-map-k,suffix,auto"


def bench(model, prompts_spec: str = "quick", methods: str = DEFAULT_METHODS, draft_model: str | None = None,
          temperatures=(0.0,), max_tokens: int = 64, repeats: int = 3, draft_n_max: int = DEFAULT_DRAFT_LENGTH,
          draft_lengths=None, ctx_size: int | None = None, warmup: bool = True, seed: int = 0, per_category=None,
          fresh_drafters: bool = True, peers=(), peer_urls=(), peer_model=None, hf_dtype: str = "bf16",
          progress: bool = True, out_dir=None, url_client=None, api_key: str | None = None, grammar=None) -> dict:
    """Run the whole bench on a loaded target Model; writes the report files when out_dir is given.
    ctx_size: as --ctx-size (None: not given). grammar: a Grammar compiled for the model (engine.constrain.
    compile_for) that every specdec request follows, plain and speculative, and every --peer-url server (in
    llama-server's json_schema / grammar fields); the Hugging Face peers cannot, so they are refused with one."""
    if grammar is not None and peers:
        raise ValueError("a grammar constrains specdec's and the --peer-url servers' requests; the Hugging Face "
                         "peers (--peers) would answer unconstrained: drop them or the grammar")
    prompts = load_prompts(prompts_spec, per_category)
    if out_dir is not None:
        check_bench_joins(out_dir, artifact(model))
    method_list = parse_methods(methods, draft_model, draft_n_max, model, draft_lengths)
    engine = bench_engine(model, context_size(ctx_size), fresh_drafters)
    if progress:
        note_capped_context(ctx_size, engine)
    for m in method_list:
        engine.drafters_for(m.spec)  # load and check drafters before measuring anything
    peer_objs = []
    if peers:
        unknown = [p for p in peers if p not in HF_PEERS]
        if unknown:
            raise ValueError(f"unknown peer {unknown[0]!r}; choose from {', '.join(HF_PEERS)} (or --peer-url)")
        hf = HFModels(model.info.path, resolve(draft_model) if draft_model else None, hf_dtype,
                      model.info.weights_dtype)
        for name in sorted(peers, key=HF_PEERS.index):  # hf-plain first: it is the others' baseline
            peer_objs.append(HFPeer(name, hf, model.tokenizer.eos_ids, draft_n_max))
    for url in peer_urls:
        peer_objs.append(URLPeer(url, peer_model, client=url_client, api_key=api_key))
        if grammar is not None:
            peer_objs[-1].constrain(grammar)
    settings = {
        "methods": methods, "draft_n_max": draft_n_max, "draft_lengths": list(draft_lengths or []),
        "ctx_size": engine.cache.max_len, "weights": model.info.weights_dtype,  # the context used
        "drafter_state": "fresh per run" if fresh_drafters else "kept across runs (drafters learn from earlier ones)",
        "prompt_set": prompts_meta(prompts_spec), "peers": [p.label for p in peer_objs],
        "hf_dtype": hf_dtype if peers else None,
        "grammar": None if grammar is None else {"kind": grammar.kind, "text": grammar.text},
    }
    results = run_bench(engine, prompts, method_list, list(temperatures), max_tokens, repeats, warmup, peer_objs,
                        seed, progress, settings, grammar=grammar)
    results["runtime"] = runtime_info(with_transformers=bool(peers))
    draft_info = None
    if draft_model is not None and any(m.spec.draft_model for m in method_list):
        draft_info = artifact(engine.draft_models.load(draft_model))
    results["artifacts"] = {"target": artifact(model), "draft": draft_info}
    if out_dir is not None:
        results["files"] = {k: str(v) for k, v in write_all(results, out_dir).items()}
    return results
