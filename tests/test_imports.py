"""The package's import graph: no cycles, and no lower layer importing a higher one.

Every `import` counts, those inside functions too: a deferred import still ties two modules
together, and a cycle through one is a design smell waiting to become an ImportError.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "specdec"

# Lower layers first; a module may import its own layer and the ones before it. The commands
# (specdec.cli and one module per subcommand) sit on top and never import each other; the package's
# __init__ (the command table) and __main__ import them.
COMMAND_MODULES = {"specdec.cli.bench", "specdec.cli.demo", "specdec.cli.export", "specdec.cli.generate",
                   "specdec.cli.inspect", "specdec.cli.pull", "specdec.cli.serve", "specdec.cli.train",
                   "specdec.cli.tune"}
LAYERS = [
    {"specdec.model", "specdec.cache", "specdec.sampling"},
    {"specdec.verify"},
    {"specdec.drafters"},
    {"specdec.engine"},
    {"specdec.train.target", "specdec.train.data", "specdec.train.loop", "specdec.bench.methods",
     "specdec.train.ttt", "specdec.train.block_loss", "specdec.train.resume", "specdec.train.distributed",
     "specdec.train.heads", "specdec.train.run", "specdec.train.summary", "specdec.train.features",
     "specdec.bench.memory", "specdec.bench.prompts", "specdec.bench.runner", "specdec.bench.peers",
     "specdec.bench.report", "specdec.server.app", "specdec.server.jobs", "specdec.server.metrics",
     "specdec.server.schemas", "specdec.server.overrides", "specdec.server.scheduler", "specdec.cli.options",
     "specdec.bench.load",
     "specdec.server.job_builder", "specdec.server.responses", "specdec.server.errors", "specdec.server.middleware",
     "specdec.bench.streaming", "specdec.bench.local_server",
     "specdec.bench.plots", "specdec.bench.results_file", "specdec.bench.provenance", "specdec.bench.method_bench",
     "specdec.bench.tune", "specdec.api", "specdec.completion", "specdec.server.logprobs", "specdec.bench.sessions",
     "specdec.bench.session_bench", "specdec.bench.session_peer", "specdec.bench.session_report",
     "specdec.cli.bench_sessions", "specdec.bench.tool_gbnf",
     "specdec.server.structured", "specdec.server.tools", "specdec.cli.grammar_args",
     "specdec.train.engine_gen", "specdec.train.recipe", "specdec.train.curves", "specdec.bench.verdicts"},
    {"specdec.cli", "specdec.cli.__main__"} | COMMAND_MODULES,
]
COMMANDS = LAYERS[-1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """specdec modules that `name` imports anywhere in its source."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def layer_of(name: str) -> int | None:
    for i, layer in enumerate(LAYERS):
        if any(name == m or name.startswith(m + ".") for m in layer):
            return i
    return None


def test_every_module_has_a_layer():
    assert [m for m in modules() if m not in ("specdec", "specdec.bench", "specdec.server", "specdec.train")
            and layer_of(m) is None] == []


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_no_module_imports_a_higher_layer_and_commands_do_not_import_each_other():
    bad = []
    for name, targets in graph().items():
        for target in targets:
            mine, theirs = layer_of(name), layer_of(target)
            if mine is None or theirs is None:
                continue
            if theirs > mine or (name in COMMAND_MODULES and target in COMMANDS):
                bad.append(f"{name} -> {target}")
    assert sorted(bad) == []


def test_the_checks_can_fail():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer_of("specdec.engine.engine") > layer_of("specdec.drafters.registry")
    src = PACKAGE / "engine" / "auto.py"
    assert "specdec.drafters.registry" in imports_of("specdec.engine.auto", src, set(modules()))


def test_nothing_below_the_commands_imports_the_cli_package():
    """Importing specdec.cli.<anything> runs specdec/cli/__init__.py, which imports every command module: a
    library module that imports one (say cli.options) is a cycle that breaks `import specdec.train.run` alone."""
    edges = graph()
    assert [(m, sorted(t for t in to if t.startswith("specdec.cli"))) for m, to in edges.items()
            if not m.startswith("specdec.cli") and m != "specdec.__main__"
            and any(t.startswith("specdec.cli") for t in to)] == []
