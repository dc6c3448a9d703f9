"""Write tests/drafters/data/llama_cpp_ngram_drafts.json: the drafts llama.cpp's ngram-map-k, ngram-map-k4v
and ngram-mod make on fixed token texts, for tests/drafters/test_ngram_reference.py.

    python scripts/llama_ngram_drafts.py --llama-cpp /path/to/llama.cpp    # a tree built with cmake (build/bin)

Compiles scripts/llama_ngram_replay.cpp against that tree's libllama-common, replays each case (a greedy
target's text: every draft keeps its longest prefix the text goes on with) and stores the texts with the
drafts. The texts are made here from a seed: recurring blocks with edits and noise, so that keys repeat
with several continuations, drafts are kept whole, in part and not at all, and ngram-mod's streak of poor
drafts empties its table.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "drafters" / "data" / "llama_cpp_ngram_drafts.json"
SOURCE = ROOT / "scripts" / "llama_ngram_replay.cpp"

# (kind, specdec options, llama.cpp's a and b, draft length, seed, requests)
CASES = [
    ("ngram-map-k", {}, (12, 1), 8, 1, 1),
    ("ngram-map-k", {"key_size": 3}, (3, 1), 4, 2, 1),
    ("ngram-map-k4v", {}, (12, 1), 8, 3, 1),
    ("ngram-map-k4v", {"key_size": 2, "min_hits": 2}, (2, 2), 3, 4, 1),
    ("ngram-map-k4v", {"key_size": 1}, (1, 1), 2, 7, 1),  # one-token keys: many values, a fifth, other winners
    ("ngram-mod", {}, (24, 48), 16, 5, 2),
    ("ngram-mod", {"n_match": 2, "n_min": 2}, (2, 2), 6, 14, 2),  # seed 14: a streak of poor drafts
]


def text(rng: random.Random, vocab: int, length: int) -> list[int]:
    """Recurring blocks of 3-40 tokens, some with one token edited, between runs of fresh tokens."""
    blocks = [[rng.randrange(vocab) for _ in range(rng.randint(3, 40))] for _ in range(6)]
    out: list[int] = []
    while len(out) < length:
        block = list(rng.choice(blocks))
        if rng.random() < 0.3:
            block[rng.randrange(len(block))] = rng.randrange(vocab)
        out += block if rng.random() < 0.85 else [rng.randrange(vocab) for _ in range(rng.randint(1, 12))]
    return out[:length]


def build(llama_cpp: Path, folder: Path) -> Path:
    binary = folder / "llama_ngram_replay"
    lib = llama_cpp / "build" / "bin"
    subprocess.run(["g++", "-std=c++17", "-O1", *[f"-I{llama_cpp / d}" for d in ("common", "include", "ggml/include",
                                                                                 "vendor")],
                    str(SOURCE), "-o", str(binary), f"-L{lib}", "-lllama-common", "-lllama", "-lggml", "-lggml-base",
                    f"-Wl,-rpath,{lib}"], check=True)
    return binary


def replay(binary: Path, kind: str, a: int, b: int, k: int, requests: list[dict]) -> list[list[list[int]]]:
    stdin = f"{kind} {a} {b} {k}\n" + "".join(
        f"{r['prompt_len']} {len(r['text'])} {' '.join(map(str, r['text']))}\n" for r in requests)
    out = subprocess.run([str(binary)], input=stdin, capture_output=True, text=True, check=True).stdout
    drafts: list[list[list[int]]] = [[]]
    for line in out.splitlines():
        if line == "end":
            drafts.append([])
        else:
            drafts[-1].append([int(t) for t in line.split()])
    return drafts[:-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="a llama.cpp source tree built in build/")
    args = parser.parse_args()
    commit = (args.llama_cpp / "build" / "common" / "build-info.cpp").read_text().split('LLAMA_COMMIT = "')[1][:7]
    cases = []
    with tempfile.TemporaryDirectory() as folder:
        binary = build(args.llama_cpp, Path(folder))
        for kind, options, (a, b), k, seed, n_requests in CASES:
            rng = random.Random(seed)
            vocab = rng.choice([40, 2000])
            body = text(rng, vocab, rng.randint(500, 900))
            requests = [{"prompt_len": rng.randint(40, len(body) // 2), "text": body}]
            for _ in range(n_requests - 1):  # a fresh prompt whose answer repeats the first request's answer
                prompt = [vocab + rng.randrange(500) for _ in range(rng.randint(30, 60))]
                start = rng.randrange(requests[0]["prompt_len"], len(body) - 200)
                requests.append({"prompt_len": len(prompt), "text": prompt + body[start : start + 200]
                                 + text(rng, vocab, 100)})
            cases.append({"kind": kind, "options": options, "draft_length": k, "requests": requests,
                          "drafts": replay(binary, kind, a, b, k, requests)})
    source = f"llama.cpp {commit} (llama-cpp-python 0.3.36's vendor tree) through scripts/llama_ngram_replay.cpp"
    lines = ",\n".join(json.dumps(case, separators=(",", ":")) for case in cases)  # a case a line
    OUT.write_text(f'{{"source": {json.dumps(source)}, "cases": [\n{lines}\n]}}\n')
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(cases)} cases)")


if __name__ == "__main__":
    main()
