"""The training-prompt recipe: public, permissively licensed instruction, chat, math and code prompts, each
source pinned to a commit of its public repository with its licence, cleaned of evaluation-set text.

The prompts are not shipped: `fetch` clones the pinned sources (the one step that needs the network), `build`
turns them into one JSON Lines file under $SPECDEC_HOME/train/ that `specdec train --prompts` reads with no
network. The target writes the responses itself (self-distillation, train/data.py), so only prompts are taken:

    python -m specdec.train.recipe fetch                 # -> $SPECDEC_HOME/train/sources/<owner>+<name>/
    python -m specdec.train.recipe build                 # -> $SPECDEC_HOME/train/prompts-v1.jsonl
    specdec train eagle3 --prompts ~/.cache/specdec/train/prompts-v1.jsonl ...

The file's first line is {"_meta": {...}}: the recipe, every source with its repository, commit, licence and
count, and what decontamination dropped. Then one {"text", "source", "category"} object per prompt.

Never in it: Spec-Bench, MT-Bench, HumanEval, MBPP, GSM8K's test split, AlpacaEval, the bench's own sets.
A prompt that shares a run of DECONTAM_WORDS words with one of them (the bench's sets, KNOWN_EVAL, and any
`--exclude` file, e.g. GSM8K's test.jsonl) is dropped, as is a prompt that contains a whole short one.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import random
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from specdec.model.catalogue import specdec_home

RECIPE = "specdec-prompts-v1"
DECONTAM_WORDS = 10  # a shared run of this many words marks a prompt as evaluation text (GPT-3's was 13)
MIN_SHORT_WORDS = 4  # an evaluation text shorter than DECONTAM_WORDS is matched whole from this many words on
PROMPT_FIELDS = ("question", "prompt", "instruction", "text", "turns", "content", "problem")
LANGUAGES = ("Python", "JavaScript", "C", "Rust", "Go", "Java", "C++", "TypeScript")


@dataclass(frozen=True)
class Source:
    name: str
    repo: str  # owner/name on GitHub
    commit: str
    paths: tuple[str, ...]  # glob patterns inside the repository
    licence: str
    category: str
    limit: int | None = None  # the most prompts taken (a random sample, fixed seed), None: all


SOURCES = (
    Source("gsm8k-train", "openai/grade-school-math", "3101c7d5072418e28b9008a6636bde82a006892c",
           ("grade_school_math/data/train.jsonl",), "MIT", "math", limit=800),
    Source("exercism-problems", "exercism/problem-specifications", "03f83310ed0547b902d211a05d23b3d74661df02",
           ("exercises/*/description.md", "exercises/*/instructions.md"), "MIT", "code"),
    Source("exercism-python-concepts", "exercism/python", "9eb657d4507d91efef99f484e7f2a1f4074911b5",
           ("exercises/concept/*/.docs/instructions.md",), "MIT", "code"),
    Source("awesome-chatgpt-prompts", "f/awesome-chatgpt-prompts", "0002c43ac93fde44221b811920aaad0ad033be47",
           ("prompts.csv",), "CC0-1.0", "chat"),
)

# A few prompts of the evaluation sets, by their opening words: a build that lets one of them through is wrong
# whatever the --exclude files were (tests/train/test_recipe.py checks the rule against them).
KNOWN_EVAL = {
    "mt-bench": ["Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural "
                 "experiences and must-see attractions."],
    "humaneval": ["Check if in given list of numbers, are any two numbers closer to each other than given "
                  "threshold."],
    "gsm8k-test": ["Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins "
                   "for her friends every day with four."],
    "alpacaeval": ["What are the names of some famous actors that started their careers on Broadway?"],
    "mbpp": ["Write a function to find the minimum cost path to reach (m, n) from (0, 0) for the given cost "
             "matrix cost[][] and a position (m, n) in cost[][]."],
}


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower().replace("\u2019", "'"))


class Decontaminator:
    """Drops prompts that share a run of `n` words with an evaluation text, or contain a whole shorter one."""

    def __init__(self, eval_texts: list[str], n: int = DECONTAM_WORDS):
        self.n = n
        self.grams: set[tuple[str, ...]] = set()
        self.short: list[str] = []  # evaluation texts of fewer than n words, matched whole
        for t in eval_texts:
            w = words(t)
            if len(w) < n:
                if len(w) >= MIN_SHORT_WORDS:  # "#### 7", an answer's line, would match every prompt with a 7
                    self.short.append(" " + " ".join(w) + " ")
            else:
                self.grams.update(tuple(w[i : i + n]) for i in range(len(w) - n + 1))

    def hit(self, text: str) -> bool:
        w = words(text)
        if any(tuple(w[i : i + self.n]) in self.grams for i in range(len(w) - self.n + 1)):
            return True
        joined = " " + " ".join(w) + " "
        return any(s in joined for s in self.short)


def eval_texts(exclude: list[Path] = ()) -> list[str]:
    """KNOWN_EVAL, the bench's prompt sets (every message), and the texts of each --exclude file (JSON Lines:
    each object's PROMPT_FIELDS, e.g. GSM8K's "question", else all its strings; else one text a line)."""
    from specdec.bench.prompts import SETS

    texts = [t for group in KNOWN_EVAL.values() for t in group]
    for prompts in SETS.values():
        for p in prompts:
            texts += [p.text] if p.text is not None else [m["content"] for m in p.messages]
    for path in exclude:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--exclude {path}: cannot be read as UTF-8 text ({exc})") from None
        for line in lines:
            obj = _json_object(line)
            if obj is None:
                texts.append(line)
            else:  # the prompt fields where the object has one (not GSM8K's "answer"), else every string
                fields = [k for k in PROMPT_FIELDS if k in obj] or list(obj)
                for v in (obj[k] for k in fields):
                    texts += [v] if isinstance(v, str) else [t for t in v if isinstance(t, str)] \
                        if isinstance(v, list) else []
    return [t for t in texts if t.strip()]


def _json_object(line: str) -> dict | None:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _markdown_task(text: str) -> str:
    """An exercise's markdown without its top heading, notes fenced with ~~~~ and link references."""
    text = re.sub(r"~~~~.*?~~~~", "", text, flags=re.S)
    lines = [ln for ln in text.splitlines() if not re.match(r"^\[[^\]]+\]:\s", ln)]
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return "\n".join(lines).strip()


def read_source(src: Source, root: Path) -> list[str]:
    """The prompts of one source from its checkout at root/<owner>+<name>/ (a ValueError names what is missing)."""
    folder = root / src.repo.replace("/", "+")
    files = sorted({f for pattern in src.paths for f in folder.glob(pattern) if f.is_file()})
    if not files:
        raise ValueError(f"{folder}: none of {', '.join(src.paths)} is there; run `python -m specdec.train.recipe "
                         f"fetch` (or check out {src.repo} at {src.commit} there)")
    out: list[str] = []
    for f in files:
        text = f.read_text(encoding="utf-8-sig")
        if src.name == "gsm8k-train":
            out += [json.loads(line)["question"] for line in text.splitlines() if line.strip()]
        elif src.name == "awesome-chatgpt-prompts":
            out += [row["prompt"] for row in csv.DictReader(io.StringIO(text)) if row.get("prompt")]
        elif (f.parent / ".deprecated").exists():
            continue
        else:
            task = _markdown_task(text)
            if src.name == "exercism-problems":  # each task in Python and in one of the others, in turn
                other = LANGUAGES[1 + (len(out) // 2) % (len(LANGUAGES) - 1)]
                out += [f"Solve this programming exercise in {lang}.\n\n{task}" for lang in ("Python", other)]
            else:
                out.append(f"Solve this Python exercise.\n\n{task}")
    return [p.strip() for p in out if p.strip()]


def build(root: Path, out: Path, exclude: list[Path] = (), sources=SOURCES, builtin: bool = True,
          seed: int = 0) -> dict:
    """Read every source under root, sample, decontaminate, deduplicate; write `out`; return its _meta."""
    from specdec.train.data import builtin_prompts

    clean = Decontaminator(eval_texts(exclude))
    rng = random.Random(seed)
    rows, seen, meta_sources = [], set(), []
    groups = [(s, read_source(s, root)) for s in sources]
    if builtin:
        groups.append((Source("specdec-builtin", "specdec", "-", (), "Apache-2.0 (specdec's own)", "mixed"),
                       builtin_prompts()))
    for src, prompts in groups:
        dropped = duplicates = 0
        kept = []
        for p in prompts:
            key = " ".join(words(p))
            if key in seen:
                duplicates += 1
            elif clean.hit(p):
                dropped += 1
            else:
                seen.add(key)
                kept.append(p)
        if src.limit is not None and len(kept) > src.limit:
            kept = rng.sample(kept, src.limit)
        rows += [{"text": p, "source": src.name, "category": src.category} for p in kept]
        meta_sources.append({"name": src.name, "repo": src.repo, "commit": src.commit, "paths": list(src.paths),
                             "license": src.licence, "category": src.category, "prompts": len(kept),
                             "dropped_as_eval_text": dropped, "duplicates": duplicates})
    rng.shuffle(rows)
    meta = {"recipe": RECIPE, "source": "see sources", "license": "per source (see sources)",
            "decontamination": f"runs of {DECONTAM_WORDS} words shared with KNOWN_EVAL, the bench's sets and "
                               f"{len(exclude)} --exclude file(s)", "sources": meta_sources}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps({"_meta": meta}) + "\n")
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    tmp.replace(out)
    return meta


def fetch(root: Path, sources=SOURCES) -> None:
    """Clone each source at its commit into root/<owner>+<name>/ (needs git and the network; run once)."""
    for src in sources:
        folder = root / src.repo.replace("/", "+")
        if (folder / ".git").is_dir():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        for cmd in (["git", "init", "-q"], ["git", "remote", "add", "origin", f"https://github.com/{src.repo}"],
                    ["git", "fetch", "-q", "--depth", "1", "origin", src.commit], ["git", "checkout", "-q", "FETCH_HEAD"]):
            subprocess.run(cmd, cwd=folder, check=True)


def default_root() -> Path:
    return specdec_home() / "train" / "sources"


def default_out() -> Path:
    return specdec_home() / "train" / "prompts-v1.jsonl"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.train.recipe", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["fetch", "build", "sources"])
    p.add_argument("--sources", type=Path, default=None, help="checkouts folder (default $SPECDEC_HOME/train/sources)")
    p.add_argument("--out", type=Path, default=None, help="prompts file (default $SPECDEC_HOME/train/prompts-v1.jsonl)")
    p.add_argument("--exclude", type=Path, nargs="*", default=[],
                   help="evaluation sets to keep out (JSON Lines or text), e.g. GSM8K's test.jsonl")
    args = p.parse_args(argv)
    root = args.sources or default_root()
    if args.action == "sources":
        for s in SOURCES:
            print(f"{s.name}\t{s.repo}@{s.commit}\t{s.licence}\t{', '.join(s.paths)}")
    elif args.action == "fetch":
        fetch(root)
    else:
        try:
            meta = build(root, args.out or default_out(), args.exclude)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for s in meta["sources"]:
            print(f"{s['name']}: {s['prompts']} prompts ({s['license']}), {s['dropped_as_eval_text']} dropped as "
                  f"evaluation text, {s['duplicates']} duplicates", file=sys.stderr)
        print(args.out or default_out())
    return 0


if __name__ == "__main__":
    sys.exit(main())
