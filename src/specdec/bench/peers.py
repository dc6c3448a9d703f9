"""Peers measured in the same harness, each labeled with what it really is.

    hf-plain          transformers generate, no speculation
    hf-assisted       transformers generate(assistant_model=draft)       (needs --draft-model)
    hf-prompt-lookup  transformers generate(prompt_lookup_num_tokens=k)
    url:<host>        any OpenAI-compatible /v1/completions endpoint (--peer-url)

transformers dequantizes a GGUF file to floating point when it loads it, so its in-memory
format differs from specdec's (int8 by default): the report says so next to every peer
number. transformers does not report how many drafted tokens it accepted, so its speculating
peers are "engaged: unknown". An endpoint's draft counters are read when it reports them
(llama.cpp "timings" draft_n / draft_n_accepted, or a "spec" object with drafted/accepted).
"""

from __future__ import annotations

import importlib
import json
import time
from pathlib import Path

import torch

from specdec.bench.runner import PeerError, RunOutput
from specdec.drafters.base import DEFAULT_DRAFT_LENGTH

HF_PEERS = ("hf-plain", "hf-assisted", "hf-prompt-lookup")


# packages that only some of the bench needs: in specdec's [test] extra, not its dependencies
OPTIONAL_PACKAGES = {"httpx": "httpx==0.28.1", "transformers": "transformers==5.24.0 accelerate==1.15.0"}


def optional_module(name: str, needed_by: str):
    """The module `name`, or a ValueError saying what to install for `needed_by` (a flag or a mode)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        raise ValueError(f"{needed_by} needs the {name} package, which specdec does not install by itself: "
                         f"pip install {OPTIONAL_PACKAGES[name]}") from None


# -- transformers ------------------------------------------------------------------------------
class HFModels:
    """The target (and draft) loaded with transformers once, shared by the hf-* peers."""

    def __init__(self, target_path, draft_path=None, dtype: str = "bf16", specdec_format: str = "int8"):
        optional_module("transformers", "--peers")
        self.specdec_format = specdec_format
        self.target_path = Path(target_path)
        self.draft_path = Path(draft_path) if draft_path else None
        self.dtype = dtype
        self._target = self._draft = None

    @staticmethod
    def _load(path: Path, dtype: str):
        from transformers import AutoModelForCausalLM  # an optional dependency (--peers)

        torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        if path.is_file():
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch_dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype)
        return model.eval()

    def target(self):
        if self._target is None:
            self._target = self._load(self.target_path, self.dtype)
        return self._target

    def draft(self):
        if self.draft_path is None:
            raise ValueError("peer hf-assisted needs --draft-model")
        if self._draft is None:
            self._draft = self._load(self.draft_path, self.dtype)
        return self._draft

    def in_memory_format(self) -> str:
        """What the loaded parameters really are (read back, not what was asked for)."""
        model = self.target()
        dtypes = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()})
        names = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
        dense = all(type(m).__name__ != "Linear" or m.weight.dtype.is_floating_point for m in model.modules()
                    if hasattr(m, "weight") and m.weight is not None)
        kind = "dense floating point" if dense else "partly quantized"
        source = "dequantized from the GGUF file by transformers" if self.target_path.is_file() else "as stored"
        held = "+".join(names.get(d, d) for d in dtypes)
        same = held == self.specdec_format and dense
        return f"{held} {kind} ({source}; {'same as' if same else 'differs from'} specdec's {self.specdec_format})"

    def param_bytes(self, which: str) -> int:
        model = self._target if which == "target" else self._draft
        if model is None:
            return 0
        return sum(p.numel() * p.element_size() for p in model.parameters())


class _Clock:
    """A generate() streamer that notes when the first new tokens arrive (the end of prefill) and how many
    came then: assisted generation hands over the first step's accepted drafts with the first token."""

    def __init__(self):
        self.calls = 0
        self.first_token_at = None
        self.first_tokens = 1

    def put(self, value):
        self.calls += 1
        if self.calls == 2 and self.first_token_at is None:  # call 1 carries the prompt
            self.first_token_at = time.perf_counter()
            self.first_tokens = max(1, int(value.numel()))

    def end(self):
        pass


class HFPeer:
    """One transformers generate() configuration on the same file as the specdec target."""

    def __init__(self, mode: str, models: HFModels, eos_ids: list[int], draft_n: int = DEFAULT_DRAFT_LENGTH):
        if mode not in HF_PEERS:
            raise ValueError(f"unknown peer {mode!r}; choose from {', '.join(HF_PEERS)}")
        self.mode = mode
        self.label = mode
        self.models = models
        self.eos_ids = list(eos_ids)
        self.draft_n = draft_n
        self.baseline = "hf-plain" if mode != "hf-plain" else "none"
        if mode == "hf-assisted":
            models.draft()  # fail early, with a clear error, when no draft model is given
        models.target()

    def options(self) -> dict:
        if self.mode == "hf-assisted":
            return {"assistant_model": str(self.models.draft_path), "num_assistant_tokens": self.draft_n,
                    "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}
        if self.mode == "hf-prompt-lookup":
            return {"prompt_lookup_num_tokens": self.draft_n}
        return {}

    def describe(self) -> dict:
        import transformers  # an optional dependency (--peers)

        return {
            "method": self.mode, "types": [], "draft_n_max": self.draft_n if self.mode != "hf-plain" else None,
            "draft_model": str(self.models.draft_path) if self.mode == "hf-assisted" else None,
            "runtime": f"transformers {transformers.__version__} generate",
            "in_memory_format": self.models.in_memory_format(),
            "speculation_path": "no" if self.mode == "hf-plain" else "yes",
            "options": {k: v for k, v in self.options().items()},
            "memory": {"weights_bytes": self.models.param_bytes("target"),
                       "drafter_bytes": self.models.param_bytes("draft") if self.mode == "hf-assisted" else 0,
                       "kv_allocated_bytes": None, "note": "parameters only; transformers' KV cache is not counted"},
            "auto_reasons": [],
        }

    def generate(self, prompt_ids, prompt_text, temperature, max_tokens, seed) -> RunOutput:
        from transformers import GenerationConfig  # an optional dependency (--peers)

        model = self.models.target()
        config = GenerationConfig(max_new_tokens=max_tokens, do_sample=temperature > 0, eos_token_id=self.eos_ids,
                                  pad_token_id=self.eos_ids[0] if self.eos_ids else 0)
        if temperature > 0:
            config.temperature, config.top_k, config.top_p = temperature, 0, 1.0
        kwargs = {}
        if self.mode == "hf-assisted":
            kwargs["assistant_model"] = self.models.draft()
            config.num_assistant_tokens = self.draft_n
            config.num_assistant_tokens_schedule = "constant"
            config.assistant_confidence_threshold = 0.0
        elif self.mode == "hf-prompt-lookup":
            config.prompt_lookup_num_tokens = self.draft_n
        if seed is not None:
            torch.manual_seed(seed)
        ids = torch.tensor([list(prompt_ids)])
        clock = _Clock()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, streamer=clock,
                                 **kwargs)
        t1 = time.perf_counter()
        new = [int(t) for t in out[0, ids.shape[1]:]]
        generated = len(new)  # the EOS that ended it counted, as specdec and llama-server count it
        for i, t in enumerate(new):
            if t in self.eos_ids:
                new, generated = new[:i], i + 1
                break
        first = clock.first_token_at or t1
        return RunOutput(new, None, first - t0, t1 - first, generated,
                         "no" if self.mode == "hf-plain" else "unknown", None if self.mode != "hf-plain" else 0,
                         None if self.mode != "hf-plain" else 0, timing_source="streamer (first new token)",
                         prefill_tokens=clock.first_tokens)


# -- an OpenAI-compatible endpoint -------------------------------------------------------------
class URLPeer:
    """POSTs each prompt (as rendered text) to <url>/v1/completions; reads timings and draft counters."""

    def __init__(self, url: str, model: str | None = None, client=None, label: str | None = None, timeout: float = 600,
                 api_key: str | None = None):
        httpx = optional_module("httpx", "--peer-url")
        from specdec.bench.load import base_url  # imports httpx, an optional dependency (--peer-url)

        base = self.base = base_url(url, "--peer-url")
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}  # --api-key
        self.client = client or httpx.Client(timeout=timeout)
        self.label = label or f"url:{httpx.URL(base).host}:{httpx.URL(base).port or ''}".rstrip(":")
        self.baseline = "none"
        self.constraint: dict = {}  # llama-server's json_schema or grammar field, sent with every prompt

    def constrain(self, grammar) -> None:
        """Send every prompt under `grammar` (a sampling.grammar.Grammar) in llama-server's own fields, which
        specdec serve reads too: json_schema (a JSON object for json_object) or grammar (GBNF)."""
        if grammar.kind == "gbnf":
            self.constraint = {"grammar": grammar.text}
        else:
            self.constraint = {"json_schema": {"type": "object"} if grammar.kind == "json_object"
                               else json.loads(grammar.text)}

    def describe(self) -> dict:
        return {"method": "server default", "types": [], "draft_n_max": None, "draft_model": None,
                "runtime": f"OpenAI-compatible endpoint {self.base}", "in_memory_format": "unknown (server side)",
                "speculation_path": "unknown", "options": {"model": self.model},
                "memory": None, "auto_reasons": []}

    def generate(self, prompt_ids, prompt_text, temperature, max_tokens, seed) -> RunOutput:
        body = {"prompt": prompt_text, "max_tokens": max_tokens, "temperature": temperature, "stream": False,
                **self.constraint}
        if self.model:
            body["model"] = self.model
        if seed is not None:
            body["seed"] = seed
        import httpx  # an optional dependency (--peer-url), there since __init__

        where = f"peer {self.base}/v1/completions"
        t0 = time.perf_counter()
        try:
            response = self.client.post(f"{self.base}/v1/completions", json=body, headers=self.headers)
        except httpx.HTTPError as exc:
            raise PeerError(f"{where}: {type(exc).__name__}: {exc}") from None
        wall = time.perf_counter() - t0
        if response.status_code != 200:
            raise PeerError(f"{where} answered {response.status_code}: {response.text[:200]}")
        try:
            data = response.json()
        except ValueError:
            raise PeerError(f"{where} answered something that is not JSON: {response.text[:120]!r}") from None
        return parse_completion(data, wall, where)


def parse_completion(data: dict, wall_s: float, where: str = "the peer") -> RunOutput:
    """A /v1/completions answer -> RunOutput; counters and timings only where the server gives them."""
    try:
        return _parse_completion(data, wall_s)
    except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:  # the server's JSON, not ours
        raise PeerError(f"{where} answered something that is not an OpenAI completion ({type(exc).__name__}: "
                        f"{exc}): {str(data)[:120]}") from None


def _parse_completion(data: dict, wall_s: float) -> RunOutput:
    choice = (data.get("choices") or [{}])[0]
    text = choice.get("text") or (choice.get("message") or {}).get("content") or ""
    if not isinstance(text, str):
        raise TypeError(f"the choice's text is {text!r}, not a string")
    usage = data.get("usage") or {}
    tokens = usage.get("completion_tokens")
    timings = data.get("timings") or {}
    spec = data.get("spec") or {}
    drafted = accepted = None
    if "draft_n" in timings:
        drafted, accepted = int(timings["draft_n"]), int(timings.get("draft_n_accepted") or 0)
    elif "drafted" in spec:
        drafted, accepted = int(spec["drafted"]), int(spec.get("accepted") or 0)
    if drafted is not None:
        engaged = "yes" if drafted > 0 else "no"
    elif isinstance(spec.get("engaged"), bool):
        engaged = "yes" if spec["engaged"] else "no"
    else:
        engaged = "unknown"
    if timings.get("predicted_ms") and timings.get("predicted_n"):
        n = int(timings["predicted_n"])
        tokens = tokens if tokens is not None else n
        decode_s = timings["predicted_ms"] / 1000.0
        prefill_s = (timings.get("prompt_ms") or 0.0) / 1000.0
        # llama.cpp starts predicted_ms when it samples the first token (timed in prompt_ms), so predicted_ms
        # covers the n-1 steps after it: RunOutput's rate, (n-1)/decode_s, as specdec's own runs count it
        source = "server timings"
    else:
        decode_s, prefill_s = wall_s, None
        source = "client wall clock (includes prefill and HTTP)"
    if tokens is None:
        tokens = 0
    return RunOutput(None, text, prefill_s, decode_s, int(tokens), engaged, drafted, accepted,
                     timing_source=source)
