"""Prompt sets for `specdec bench`: small, mixed, short enough for CPU runs.

A prompt is either raw text (completed as is) or chat messages (rendered with the
model's chat template). Categories: code (completion), edit (rewrite a pasted
document), summarize (a pasted text), prose (open writing), chat (multi-turn).
Speculation should help most on edit and code, least on prose: the set is meant
to show both.

    >>> prompts = load_prompts("quick")
    >>> sorted({p.category for p in prompts})
    ['chat', 'code', 'edit', 'prose', 'summarize']

A file given to --prompts is JSON Lines: one {"id", "category", "text" | "messages"}
object per line, optionally preceded by a {"_meta": {"source": ..., "license": ...}} line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

CATEGORIES = ("code", "edit", "summarize", "prose", "chat")

META = {
    "name": "specdec-mixed",
    "version": 1,
    "source": "written for specdec by its authors (no external data)",
    "license": "Apache-2.0 (same as specdec)",
}


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str | None = None  # raw completion prompt
    messages: tuple[dict, ...] = field(default=())  # chat messages, rendered with the model's template

    def __post_init__(self) -> None:
        if (self.text is None) == (not self.messages):
            raise ValueError(f"prompt {self.id!r}: give exactly one of 'text' or 'messages'")

    def render(self, tokenizer) -> list[int]:
        """Token ids for this prompt: raw text as is, chat messages through the chat template."""
        if self.text is not None:
            return tokenizer.encode(self.text)
        messages = [dict(m) for m in self.messages]
        if tokenizer.chat_template:
            return tokenizer.encode(tokenizer.apply_chat_template(messages), add_bos=False)
        plain = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages) + "Assistant:"
        return tokenizer.encode(plain)


def _user(text: str) -> tuple[dict, ...]:
    return ({"role": "user", "content": text},)


_INVENTORY = """\
def load_inventory(path):
    data = {}
    with open(path) as f:
        for line in f:
            name, qty, price = line.strip().split(",")
            data[name] = {"qty": int(qty), "price": float(price)}
    return data


def total_value(data):
    total = 0.0
    for name in data:
        total += data[name]["qty"] * data[name]["price"]
    return total


def restock(data, name, amount):
    if name not in data:
        raise KeyError(name)
    data[name]["qty"] += amount
    return data[name]["qty"]
"""

_MEETING = """\
Meeting notes, 14 March
attendees: Priya, Tom, Ana, Lee
- Priya: the release branch is cut on Friday. QA starts Monday.
- Tom: two open bugs block the release: the login timeout and the CSV export encoding.
- Ana: docs for the new export settings are half done; needs screenshots.
- Lee: the staging server runs out of disk every few days; proposes a weekly cleanup job.
decisions: fix both blockers before Friday; Lee owns the cleanup job; Ana finishes docs by Wednesday.
next meeting: 21 March
"""

_CONFIG = """\
server_host = "0.0.0.0"
server_port = 8080
max_connections = 64
request_timeout = 30
log_level = "info"
cache_size = 1024
enable_metrics = true
"""

_ARTICLE = """\
Cities that planted trees along their streets in the last twenty years report cooler summers \
on those streets, fewer complaints about noise, and more people walking. The trees are not free: \
young trees need water for their first three summers, roots lift pavements when the wrong species \
is chosen, and fallen leaves block drains every autumn. Planners now pick species by the width of \
the street and the depth of the soil, and several cities pay residents a small sum to water the \
tree in front of their house. The largest gains came where trees shaded bus stops and school \
routes, because those are the places people wait or walk at the hottest time of the day."""

_REPORT = """\
Quarterly support report. Tickets opened: 1,240, up 8 percent on the previous quarter. Median time \
to first reply fell from 6 hours to 4 hours after the team added a second shift. Most tickets \
concerned password resets (31 percent), billing questions (22 percent) and the mobile app crashing \
on older phones (15 percent). The crash was fixed in version 4.2, and crash tickets dropped by half \
in the last month of the quarter. Customer satisfaction stayed at 4.3 out of 5. The team asks for \
a self-service password reset page, which would remove about a third of all tickets."""

_EMAIL = """\
Hi all, a quick update on the office move. The movers come on Thursday at 8am, so please pack your \
desks by Wednesday evening and label every box with your name and new room number. IT will \
disconnect computers on Wednesday at 5pm and reconnect them on Friday morning. The kitchen in the \
new building opens next Monday; until then there is coffee on the second floor. Parking passes for \
the new garage are at reception from Tuesday. Thanks for your patience, Maria"""

PROMPTS: tuple[Prompt, ...] = (
    # -- code completion (raw text: the model continues the code) --------------------------------
    Prompt("code-binary-search", "code", text=(
        "def binary_search(items, target):\n"
        '    """Return the index of target in the sorted list items, or -1 if absent."""\n'
        "    lo, hi = 0, len(items) - 1\n"
        "    while lo <= hi:\n")),
    Prompt("code-dataclass", "code", text=(
        "from dataclasses import dataclass\n\n\n"
        "@dataclass\n"
        "class Vector:\n"
        "    x: float\n"
        "    y: float\n\n"
        "    def __add__(self, other):\n"
        "        return Vector(self.x + other.x, self.y + other.y)\n\n"
        "    def __sub__(self, other):\n"
        "        return Vector(self.x - other.x, self.y - other.y)\n\n"
        "    def __mul__(self, k):\n")),
    Prompt("code-tests", "code", messages=_user(
        "Write pytest tests for this module. Cover every function.\n\n```python\n" + _INVENTORY + "```")),
    # -- editing a pasted document ---------------------------------------------------------------
    Prompt("edit-rename", "edit", messages=_user(
        "Rename the variable `data` to `inventory` everywhere in this code. Reply with the full code "
        "only.\n\n```python\n" + _INVENTORY + "```")),
    Prompt("edit-reformat", "edit", messages=_user(
        "Convert this config file to JSON. Keep every key and value. Reply with the JSON only.\n\n"
        + _CONFIG)),
    Prompt("edit-notes", "edit", messages=_user(
        "Rewrite these meeting notes as a Markdown table with columns Person and Update. Keep the "
        "wording of each update.\n\n" + _MEETING)),
    # -- summarising a pasted text ---------------------------------------------------------------
    Prompt("summarize-article", "summarize", messages=_user(
        "Summarise this text in two sentences.\n\n" + _ARTICLE)),
    Prompt("summarize-report", "summarize", messages=_user(
        "Summarise the key numbers in this report as a bulleted list.\n\n" + _REPORT)),
    Prompt("summarize-email", "summarize", messages=_user(
        "What do I need to do, and by when? Answer from this email.\n\n" + _EMAIL)),
    # -- open prose ------------------------------------------------------------------------------
    Prompt("prose-story", "prose", messages=_user(
        "Write a short story about a lighthouse keeper who finds a message in a bottle.")),
    Prompt("prose-explain", "prose", messages=_user(
        "Explain to a twelve-year-old why the sky is blue.")),
    Prompt("prose-letter", "prose", messages=_user(
        "Write a friendly letter to a neighbour thanking them for looking after your cat.")),
    # -- multi-turn chat -------------------------------------------------------------------------
    Prompt("chat-trip", "chat", messages=(
        {"role": "user", "content": "I have three days in Lisbon. What should I see?"},
        {"role": "assistant", "content": "Day one: Alfama and the castle. Day two: Belem, with the tower "
                                         "and the monastery. Day three: a train to Sintra."},
        {"role": "user", "content": "Sintra sounds good. How do I get there and what should I see first?"},
    )),
    Prompt("chat-recipe", "chat", messages=(
        {"role": "user", "content": "How do I make a simple tomato sauce?"},
        {"role": "assistant", "content": "Soften a chopped onion and two cloves of garlic in olive oil, add "
                                         "a tin of tomatoes, salt, and simmer for twenty minutes."},
        {"role": "user", "content": "Can I make it without onion? And how long does it keep?"},
    )),
    Prompt("chat-code-review", "chat", messages=(
        {"role": "user", "content": "Is this fine?\n\n```python\ndef mean(xs):\n    return sum(xs) / len(xs)\n```"},
        {"role": "assistant", "content": "It works for non-empty lists but raises ZeroDivisionError for an "
                                         "empty one."},
        {"role": "user", "content": "Fix it so that an empty list returns None, and show the whole function."},
    )),
)

# The prompts `specdec tune` measures on: one per category, none of them in the mixed set (so that the bench
# checks auto on prompts it was not chosen on).
_LEDGER = """\
class Ledger:
    def __init__(self):
        self.entries = []

    def add(self, amount, note):
        self.entries.append({"amount": amount, "note": note})

    def total(self):
        total = 0
        for entry in self.entries:
            total += entry["amount"]
        return total

    def largest(self):
        best = None
        for entry in self.entries:
            if best is None or entry["amount"] > best["amount"]:
                best = entry
        return best
"""

_MEETING = (
    "The library board met on Tuesday to discuss the renovation of the reading room. The contractor said the "
    "new shelving will arrive in March, two weeks later than planned, because the supplier changed factories. "
    "The board agreed to keep the children's section open during the work by moving it to the community hall. "
    "Members raised concerns about noise during exam season, and the contractor promised to schedule drilling "
    "before ten in the morning. The budget remains within the approved amount, although the cost of lighting "
    "rose by eight percent. The next meeting will review the paint colours and the opening date."
)

CALIBRATION = (
    Prompt("tune-code-parse", "code", text=(
        "def parse_duration(text):\n"
        "    \"\"\"Parse strings like '1h30m', '45s' or '2h' into a number of seconds.\n\n"
        "    Raise ValueError for anything else.\n    \"\"\"\n")),
    Prompt("tune-edit-rename", "edit", messages=(
        {"role": "user", "content": "Rename the method `largest` to `biggest_entry` and the attribute `entries` "
                                    "to `items` in this class. Return the whole class.\n\n" + _LEDGER},)),
    Prompt("tune-summarize-meeting", "summarize", messages=(
        {"role": "user", "content": "Summarize these meeting notes in three sentences.\n\n" + _MEETING},)),
    Prompt("tune-prose-clockmaker", "prose", messages=(
        {"role": "user", "content": "Write a short story about a clockmaker who finds a clock that runs "
                                    "backwards."},)),
    Prompt("tune-chat-garden", "chat", messages=(
        {"role": "user", "content": "What vegetables are easy to grow on a balcony?"},
        {"role": "assistant", "content": "Cherry tomatoes, lettuce, radishes and herbs such as basil and mint "
                                         "grow well in pots with enough sun."},
        {"role": "user", "content": "How often should I water the tomatoes in summer?"},
    )),
)

SETS = {
    "mixed": PROMPTS,
    "calibration": CALIBRATION,
    # one prompt per category, for quick checks
    "quick": tuple(next(p for p in PROMPTS if p.category == c) for c in CATEGORIES),
}


def load_prompts(spec: str, per_category: int | None = None) -> list[Prompt]:
    """Prompts from a set name ('mixed', 'quick'), a comma list of categories, or a .jsonl file."""
    if spec in SETS:
        prompts = list(SETS[spec])
    elif all(c.strip() in CATEGORIES for c in spec.split(",")):
        wanted = [c.strip() for c in spec.split(",")]
        prompts = [p for p in PROMPTS if p.category in wanted]
    else:
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"--prompts {spec!r} is neither a prompt set ({', '.join(SETS)}), a list of "
                             f"categories ({', '.join(CATEGORIES)}) nor a file")
        prompts = read_jsonl(path)[1]
    if per_category is not None:
        seen: dict[str, int] = {}
        kept = []
        for p in prompts:
            seen[p.category] = seen.get(p.category, 0) + 1
            if seen[p.category] <= per_category:
                kept.append(p)
        prompts = kept
    if not prompts:
        raise ValueError(f"--prompts {spec!r} selects no prompts")
    return prompts


def prompts_meta(spec: str) -> dict:
    """Where the prompts came from, for the report."""
    if spec in SETS or all(c.strip() in CATEGORIES for c in spec.split(",")):
        return {**META, "selection": spec}
    meta = read_jsonl(Path(spec))[0]
    return {"name": Path(spec).name, "source": meta.get("source", "unknown (file has no _meta line)"),
            "license": meta.get("license", "unknown"), "selection": str(spec)}


def read_jsonl(path: Path) -> tuple[dict, list[Prompt]]:
    """(the _meta object or {}, the prompts) of a --prompts file; a ValueError naming the file and line for
    anything else than the format in this module's docstring."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    meta: dict = {}
    prompts: list[Prompt] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not valid JSON ({exc})") from None
        try:
            if not isinstance(obj, dict):
                raise ValueError(f"a JSON {type(obj).__name__}, where each line is an object")
            if "_meta" in obj:
                if not isinstance(obj["_meta"], dict):
                    raise ValueError("'_meta' must be an object (source, license)")
                meta = obj["_meta"]
                continue
            prompt = _prompt(obj)
        except ValueError as exc:
            raise ValueError(f"{path}:{n}: {exc}") from None
        if any(p.id == prompt.id for p in prompts):
            raise ValueError(f"{path}:{n}: prompt id {prompt.id!r} is used twice (ids name the rows of the report)")
        prompts.append(prompt)
    return meta, prompts


def _prompt(obj: dict) -> Prompt:
    """One prompt line: {"id", "category"?, "text" | "messages"}, every field of its JSON type."""
    if "id" not in obj:
        raise ValueError("a prompt needs an 'id'")
    if not isinstance(obj["id"], (str, int)) or isinstance(obj["id"], bool):
        raise ValueError(f"'id' must be a string, got {obj['id']!r}")
    category = obj.get("category", "other")
    if not isinstance(category, str) or not category.strip():
        raise ValueError(f"'category' must be a non-empty string, got {category!r}")
    if category == "all":  # the reports' row over every category
        raise ValueError("'category' \"all\" is the reports' name for every category together; rename it")
    text = obj.get("text")
    if text is not None and not isinstance(text, str):
        raise ValueError(f"'text' must be a string, got {text!r}")
    messages = obj.get("messages") or []
    if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise ValueError("'messages' must be a list of {\"role\": ..., \"content\": ...} objects with string "
                         f"values, got {messages!r}")
    return Prompt(str(obj["id"]), category, text, tuple(messages))


def write_jsonl(path: Path, prompts=PROMPTS, meta=META) -> None:
    """Write a set as JSON Lines (with its _meta line), e.g. as a starting point for your own."""
    lines = [json.dumps({"_meta": meta})]
    for p in prompts:
        obj = {"id": p.id, "category": p.category}
        obj.update({"text": p.text} if p.text is not None else {"messages": list(p.messages)})
        lines.append(json.dumps(obj))
    Path(path).write_text("\n".join(lines) + "\n")
