"""Training text for drafter heads: what the target itself writes, plus a plain corpus.

Self-distillation: the head learns to predict the target, so the best text is the
target's own output. Prompts (built in, or a file with one per line) are wrapped in the
model's chat template and the target continues them by sampling; a plain corpus (text
files, or the built-in one: docstrings of the Python standard library, which every
machine with Python has) adds variety. The benchmark prompt sets (specdec/bench/prompts*)
are never used here.
"""

from __future__ import annotations

import importlib
import inspect
import json
import random
import sys
import zipfile
from pathlib import Path

import numpy as np

GEN_TEMPERATURE = 0.7  # what the target samples its training answers at unless told (--gen-temperature)

_TOPICS = ["the ocean", "a lighthouse keeper", "volcanoes", "bread baking", "the moon landing", "honey bees",
           "a lost robot", "winter in the mountains", "coffee", "the printing press", "rainforests", "chess",
           "a small village library", "electric cars", "the water cycle", "friendship", "photosynthesis",
           "ancient Rome", "a rainy afternoon", "learning to ride a bicycle", "black holes", "gardening",
           "the history of tea", "a train journey", "recycling", "penguins", "the internet", "a music festival",
           "public transport", "healthy sleep", "deserts", "a birthday surprise", "clouds", "the first computers",
           "a street market", "wind power", "dinosaurs", "a mountain hike", "owls", "the human heart"]
_TEMPLATES = ["Write a short story about {t}.", "Explain {t} to a ten-year-old.", "Give me five facts about {t}.",
              "Write a poem about {t}.", "What are the pros and cons of {t}?", "Summarize what you know about {t}.",
              "Write a blog post introduction about {t}.", "Describe {t} in three sentences.",
              "Write a dialogue between two friends about {t}.", "List some questions a student might ask about {t}."]
_CODE_TASKS = ["reverses a string", "checks whether a number is prime", "counts the words in a text",
               "merges two sorted lists", "computes the factorial of n", "finds the largest element of a list",
               "removes duplicates from a list", "converts Celsius to Fahrenheit", "reads a CSV file and sums a column",
               "returns the n-th Fibonacci number", "validates an email address", "flattens a nested list",
               "computes the average of a list of numbers", "sorts a dictionary by value", "checks for palindromes"]
_CODE_TEMPLATES = ["Write a Python function that {t}.", "Write a JavaScript function that {t}.",
                   "Show how to write a function in C that {t}.", "Explain step by step how a program {t}."]


def builtin_prompts() -> list[str]:
    """About 550 instructions made from templates (topics x forms, programming tasks x languages)."""
    out = [tpl.format(t=t) for t in _TOPICS for tpl in _TEMPLATES]
    out += [tpl.format(t=t) for t in _CODE_TASKS for tpl in _CODE_TEMPLATES]
    return out


def builtin_corpus(max_docs: int = 4000) -> list[str]:
    """Docstrings of Python standard library modules, classes and functions (deterministic order)."""
    names = sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in (
        "antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "lib2to3", "ensurepip", "venv", "pydoc_data"))
    docs: list[str] = []
    for name in names:
        try:
            mod = importlib.import_module(name)
        except Exception:
            continue
        for obj in [mod] + [v for _, v in sorted(vars(mod).items()) if inspect.isclass(v) or inspect.isfunction(v)]:
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str) and len(doc) > 200:
                docs.append(inspect.cleandoc(doc))
            if len(docs) >= max_docs:
                return docs
    return docs


def _read_text(path, what: str, errors: str = "strict") -> str:
    try:
        return Path(path).read_text(encoding="utf-8-sig", errors=errors)  # a byte-order mark is no text
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} {path} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ValueError(f"{what} {path}: {exc.strerror}") from None


def read_prompts(path: str | None) -> list[str]:
    """--prompts: one prompt a line, or JSON Lines of {"text": ...} objects (train/recipe.py's file, whose
    {"_meta": ...} line is skipped); each distinct prompt once, in the file's order."""
    if path is None:
        return builtin_prompts()
    lines = [line.strip() for line in _read_text(path, "--prompts").splitlines() if line.strip()]
    jsonl = str(path).endswith(".jsonl") or (lines[:1] != [] and lines[0].startswith('{"'))
    prompts = [_json_prompt(line, path, n) for n, line in enumerate(lines, 1)] if jsonl else lines
    prompts = list(dict.fromkeys(p for p in prompts if p))  # a prompt twice could sit on both sides of --val
    if not prompts:
        raise ValueError(f"{path}: no prompts (one a line, or JSON Lines with a \"text\" field; the file is empty "
                         "or blank)")
    return prompts


def _json_prompt(line: str, path, n: int) -> str | None:
    """One JSON Lines prompt: its "text"; None for the {"_meta": ...} line."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--prompts {path} line {n}: not JSON ({exc.msg}); a JSON Lines file has one object a "
                         "line") from None
    if isinstance(obj, dict) and "_meta" in obj:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
        raise ValueError(f"--prompts {path} line {n}: an object with a \"text\" string is wanted")
    return obj["text"].strip()


def read_corpus(paths: list[str] | None) -> list[str]:
    if not paths:
        return builtin_corpus()
    docs = []
    for p in paths:
        text = _read_text(p, "--data", errors="replace")
        short = ""  # paragraphs of 80 characters or fewer go on together (short Q&A pairs make chunks too)
        for d in text.split("\n\n"):
            d = d.strip()
            if not d:
                continue
            short = f"{short}\n\n{d}" if short else d
            if len(short) > 80:
                docs.append(short)
                short = ""
        if short:
            docs.append(short)
    return docs


def chat_prompt_ids(tokenizer, prompt: str, keep: int | None = None) -> list[int]:
    """The prompt as the target sees it; keep: only its last `keep` tokens are wanted, so a prompt of more than
    16 characters per token is cut first (a long line is never encoded whole)."""
    if keep is not None:
        prompt = prompt[-16 * keep:]
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        return tokenizer.encode(text, add_bos=False)  # the template writes BOS (Gemma's <bos>) where it wants one
    return tokenizer.encode(prompt)


def answer_marker(tokenizer) -> tuple[int, ...]:
    """The ids the chat template writes before every answer, its generation prompt (ChatML's
    "<|im_start|>assistant\n", Gemma's "<start_of_turn>model\n"); () for a model without a template."""
    if not tokenizer.chat_template:
        return ()
    turn = [{"role": "user", "content": "Hi"}]
    asked = tokenizer.encode(tokenizer.apply_chat_template(turn), add_bos=False)
    bare = tokenizer.encode(tokenizer.apply_chat_template(turn, add_generation_prompt=False), add_bos=False)
    same = 0
    while same < min(len(asked), len(bare)) and asked[same] == bare[same]:
        same += 1
    return tuple(asked[same:])


def answer_start(seq: list[int], marker: tuple[int, ...]) -> int:
    """Where the target's own answer begins in a training sequence: after the last `marker` in it, or 0 (all
    of it) where there is none (a corpus chunk, a model without a chat template). Drafting proposes answer
    tokens only, so the losses score the pairs and anchors of the answer (loop.pad_batch's `answer`).
    [5, 1, 2, 7, 8] with marker (1, 2) -> 3."""
    k = len(marker)
    for i in range(len(seq) - k, -1, -1) if k else ():
        if seq[i] == marker[0] and tuple(seq[i : i + k]) == marker:
            return i + k
    return 0


def build_sequences(target, tokenizer, prompts: list[str], corpus: list[str], num_generated: int, gen_tokens: int,
                    seq_len: int, num_corpus: int, seed: int, batch: int = 512, temperature: float = GEN_TEMPERATURE,
                    progress=None, held_out: int = 0, done: list[list[int]] = (), on_chunk=None) -> list[list[int]]:
    """Token sequences (each <= seq_len): target-generated continuations, then corpus chunks.

    The first `held_out` sequences continue prompts no other sequence uses, so that a validation
    set taken from the front measures text the head has not seen the prompt of. `target` writes the
    continuations: a DenseTarget or an EngineGenerator (train/engine_gen.py), `batch` prompts a call.
    done: the generated sequences of an interrupted call with the same arguments (whole batches, as
    on_chunk(sequences so far) was given them after each batch): generation goes on after them, each batch
    sampling with a generator seeded by (seed, its first index), so the result is an uninterrupted call's."""
    torch = __import__("torch")
    rng = random.Random(seed)
    order = list(dict.fromkeys(prompts))  # distinct: a prompt given twice is on one side of the split only
    rng.shuffle(order)
    # the held-out sequences continue at most half of the prompts, the training ones the others: held_out
    # prompts of 20 left one prompt to every training sequence, and the held-out ones took training prompts too
    n_val = min(held_out, num_generated)
    held = order[: min(n_val, len(order) // 2)]
    rest = order[len(held):]
    chosen = [(held or rest)[i % len(held or rest)] for i in range(n_val)]
    chosen += [rest[i % len(rest)] for i in range(num_generated - n_val)]
    eos = set(tokenizer.eos_ids)
    if len(done) % batch and len(done) < len(chosen) or len(done) > len(chosen):
        raise ValueError(f"{len(done)} sequences already generated is not a whole number of batches of {batch} "
                         f"out of {len(chosen)}: they were made with other settings")
    seqs: list[list[int]] = [list(s) for s in done]
    if progress is not None and seqs:
        progress(len(seqs))
    for i in range(len(seqs), len(chosen), batch):
        ids = [chat_prompt_ids(tokenizer, p, seq_len // 2)[-(seq_len // 2):] for p in chosen[i : i + batch]]
        gen = torch.Generator().manual_seed((seed * 1_000_003 + i) % 2**63)
        for s in target.generate(ids, gen_tokens, temperature, eos, gen):
            seqs.append(s[:seq_len])
        if progress is not None:
            progress(len(ids))
        if on_chunk is not None:
            on_chunk(seqs)
    seqs += corpus_chunks(tokenizer, corpus, num_corpus, seq_len, rng)
    return seqs


def corpus_chunks(tokenizer, corpus: list[str], count: int, seq_len: int, rng: random.Random) -> list[list[int]]:
    """Up to `count` chunks of at most seq_len tokens (of more than 8): the start of each document in a
    shuffled order, then, while chunks are wanted, the later pieces of the long ones (a file without blank
    lines is one document, and gives as many chunks as --corpus-seqs asks for)."""
    docs = list(corpus)
    rng.shuffle(docs)
    chunks, longer = [], []
    for d in docs:
        if len(chunks) >= count:
            return chunks
        ids = tokenizer.encode(d[: 16 * seq_len * count])  # no more text than `count` chunks can hold
        if len(ids) > 8:
            chunks.append(ids[:seq_len])
        if len(ids) > seq_len:
            longer.append(ids)
    for ids in longer:
        for i in range(seq_len, len(ids), seq_len):
            if len(chunks) >= count:
                return chunks
            if len(ids) - i > 8:
                chunks.append(ids[i : i + seq_len])
    return chunks


def save_sequences(seqs: list[list[int]], path) -> None:
    """Token sequences as a compressed .npz (tokens flat, lengths); uint16 when the ids fit."""
    flat = [t for s in seqs for t in s]
    dtype = np.uint16 if (max(flat, default=0) < 2**16) else np.int32
    with open(path, "wb") as f:  # a file, so that numpy adds no ".npz" to a path without it (replaced()'s)
        np.savez_compressed(f, tokens=np.array(flat, dtype=dtype), lengths=np.array([len(s) for s in seqs], np.int64))


def load_sequences(path, vocab_size: int | None = None) -> list[list[int]]:
    """What save_sequences wrote; a ValueError naming the file for anything else (a truncated archive, float
    or negative token ids, ids the target's vocabulary does not have, lengths that do not add up)."""
    try:
        loaded = np.load(path)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # a .npy array: no `with`, and not our format
            raise ValueError(f"a single {loaded.dtype} array, not an archive of tokens and lengths")
        with loaded as f:
            tokens, lengths = f["tokens"], f["lengths"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path}: not a training-sequence file written by specdec train ({e})") from None
    for name, a in (("tokens", tokens), ("lengths", lengths)):
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise ValueError(f"{path}: {name} must be a flat array of integers, got {a.dtype} of shape {a.shape}")
    tokens = tokens.astype(np.int64)
    if len(lengths) and lengths.min() < 0:
        raise ValueError(f"{path}: a sequence length is negative ({int(lengths.min())})")
    if int(lengths.sum()) != len(tokens):
        raise ValueError(f"{path}: lengths add up to {int(lengths.sum())} tokens but the file holds {len(tokens)}")
    if len(tokens) and (tokens.min() < 0 or (vocab_size is not None and tokens.max() >= vocab_size)):
        bad = int(tokens.min()) if tokens.min() < 0 else int(tokens.max())
        raise ValueError(f"{path}: token id {bad} is outside the target's vocabulary of {vocab_size} "
                         "(sequences made for another model?)" if vocab_size else f"{path}: token id {bad} is negative")
    ends = np.cumsum(lengths)
    return [tokens[e - n : e].tolist() for e, n in zip(ends, lengths)]
