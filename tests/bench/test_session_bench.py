"""`specdec bench --sessions` on the tiny model: the mode runs the sessions through the prefix cache, free and
under their constraints, writes its table into results.json and report.md, and its identical-output column is
computed from the tokens (a broken method turns it to NO). llama-server on the same sessions where its binary
is here (tests/conftest.py MACHINE_SKIPS: "no llama-server binary here")."""

from __future__ import annotations

import json

import pytest

from specdec.bench import session_bench
from specdec.bench.methods import parse_methods
from specdec.bench.session_bench import run_sessions
from specdec.bench.session_peer import find_llama_server
from specdec.bench.session_report import sessions_markdown
from specdec.bench.sessions import Turn, load_sessions
from specdec.cli import main

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"], "additionalProperties": False}}}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "amount": {"type": "number"}},
          "required": ["name", "amount"], "additionalProperties": False}
SESSIONS = [  # short enough for the tiny model's 512-token context with its byte-level tokenizer
    {"id": "json", "messages": [
        {"role": "system", "content": "Answer in JSON."}, {"role": "user", "content": "Ann paid 5."},
        {"role": "assistant", "content": '{"name": "Ann", "amount": 5}'}, {"role": "user", "content": "Bo paid 7."},
        {"role": "assistant", "content": '{"name": "Bo", "amount": 7}'}],
     "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}},
    {"id": "tool", "messages": [
        {"role": "system", "content": "Use lookup."}, {"role": "user", "content": "What is x?"},
        {"role": "assistant", "content": '<tool_call>{"name": "lookup", "arguments": {"key": "x"}}</tool_call>'},
        {"role": "tool", "content": "4"}, {"role": "assistant", "content": "x is 4."}], "tools": TOOLS},
]


@pytest.fixture
def session_file(tmp_path):
    path = tmp_path / "sessions.jsonl"
    meta = {"_meta": {"max_tokens": 6}}
    path.write_text("\n".join(json.dumps(o) for o in [meta, *SESSIONS]) + "\n")
    return path


def test_the_bench_mode_writes_the_sessions_table(tiny_hf_dir, session_file, tmp_path):
    out = tmp_path / "out"
    rc = main(["bench", "-m", str(tiny_hf_dir), "--weights", "fp32", "-c", "512", "--sessions", str(session_file),
               "--methods", "none,ngram-simple", "--constrain", "both", "--out", str(out), "--no-progress"])
    assert rc == 0
    section = json.loads((out / "results.json").read_text())["sessions"]
    assert section["settings"]["max_tokens"] == 6  # the file's _meta budget
    labels = [c["label"] for c in section["configs"]]
    assert labels == ["none", "ngram-simple", "none+schema", "ngram-simple+schema"]
    rows = section["turns"]
    assert len(rows) == 4 * 4  # 2 sessions x 2 turns, 4 configs
    for r in rows:
        assert {"ttft_s", "decode_tokens_per_s", "speedup", "identical_to_baseline", "cached_tokens"} <= set(r)
        assert r["identical_to_baseline"] is True  # greedy: speculation changes no token, free or constrained
    second = [r for r in rows if r["turn"] == 2]
    assert all(r["cached_tokens"] > 0 for r in second)  # the prefix cache gave turn 2 turn 1's rows
    free = {(r["config"], r["session"], r["turn"]): r for r in rows}
    loaded = load_sessions(session_file)  # constrained turns follow their grammar; the tool session's turn 2 is free
    assert [r["constrained"] for r in rows if r["config"] == "none+schema"] == [True, True, True, False]
    assert free[("none+schema", "tool", 2)]["token_ids"] == free[("none", "tool", 2)]["token_ids"]
    assert loaded[0].constraint(1)[0] == "json_schema" and loaded[1].constraint(1)[0] == "gbnf"
    report = (out / "report.md").read_text()
    assert "## Agentic sessions" in report and "none+schema TTFT s" in report and "| speed-up | same |" in report
    assert "last/first turn TTFT" in report


def test_constrained_turns_follow_the_schema_and_the_call_grammar(tiny_model, session_file):
    methods = parse_methods("none", model=tiny_model)
    section = run_sessions(tiny_model, load_sessions(session_file), methods, "on", 6, "on", ctx_size=512,
                           progress=False)
    text = {(r["session"], r["turn"]): tiny_model.tokenizer.decode(r["token_ids"]) for r in section["turns"]}
    for key, forced in ((("json", 1), '{"name": "'), (("json", 2), '{"name": "'),
                        (("tool", 1), '<tool_call>\n{"name": "lookup", "arguments": {"key": "')):
        assert len(text[key]) >= 5 and forced.startswith(text[key][:len(forced)]), (key, text[key])


def test_the_identical_flag_is_computed_from_the_tokens(tiny_model, session_file, monkeypatch):
    real = session_bench.run_session

    def broken(engine, session, max_tokens, spec=None, grammars=None):  # a method that changes turn 2's last token
        turns = real(engine, session, max_tokens, spec, grammars)
        if spec is not None and spec.enabled and len(turns) > 1:  # not the 1-turn warm-up
            t = turns[1]
            turns[1] = Turn(t.session, t.turn, t.prompt_tokens, t.cached_tokens, t.ttft_s, t.decode_s,
                            t.token_ids[:-1] + ((t.token_ids[-1] + 1) % 500,), t.constrained)
        return turns

    monkeypatch.setattr(session_bench, "run_session", broken)
    methods = parse_methods("none,ngram-simple", model=tiny_model)
    section = run_sessions(tiny_model, load_sessions(session_file)[:1], methods, "on", 6, "off", ctx_size=512,
                           progress=False)
    same = {(r["config"], r["turn"]): r["identical_to_baseline"] for r in section["turns"]}
    assert same == {("none", 1): True, ("none", 2): True, ("ngram-simple", 1): True, ("ngram-simple", 2): False}
    summary = {s["config"]: s["identical"] for s in section["summary"]}
    assert summary == {"none": True, "ngram-simple": False}
    assert "| NO |" in "\n".join(sessions_markdown(section))


def test_the_sessions_mode_refuses_the_prompt_bench_flags(tiny_hf_dir, session_file, capsys):
    rc = main(["bench", "-m", str(tiny_hf_dir), "--sessions", str(session_file), "--repeats", "2"])
    assert rc == 2 and "--repeats set the prompt-set bench" in capsys.readouterr().err
    rc = main(["bench", "-m", str(tiny_hf_dir), "--sessions", str(session_file), "--peers", "hf-plain"])
    assert rc == 2 and "--sessions measures the peer llama-server only" in capsys.readouterr().err
    rc = main(["bench", "-m", str(tiny_hf_dir), "--prefix-cache", "on"])
    assert rc == 2 and "--prefix-cache set the --sessions mode" in capsys.readouterr().err


def test_llama_server_runs_the_same_sessions_in_the_same_table(tmp_path, session_file):
    if find_llama_server() is None:
        pytest.skip("no llama-server binary here (set LLAMA_CPP_BIN to llama.cpp's build/bin)")
    from helpers.tiny import make_gguf_model
    from specdec.model.load import load_model

    path = make_gguf_model(tmp_path / "tiny.gguf")
    out = tmp_path / "out"
    rc = main(["bench", "-m", str(path), "--weights", "fp32", "-c", "512", "--threads", "1", "--sessions",
               str(session_file), "--methods", "none", "--constrain", "both", "--peers", "llama-server",
               "--out", str(out), "--no-progress"])
    assert rc == 0
    section = json.loads((out / "results.json").read_text())["sessions"]
    peer = {c["label"]: c for c in section["configs"] if c["kind"] == "peer"}
    assert set(peer) == {"llama-server", "llama-server+schema"}
    assert peer["llama-server"]["runtime"].startswith("llama-server") and "--cache-reuse" in \
        peer["llama-server"]["command_line"]
    rows = {(r["config"], r["session"], r["turn"]): r for r in section["turns"]}
    for label in peer:
        assert rows[(label, "json", 1)]["cached_tokens"] == 0  # a fresh conversation
        assert rows[(label, "json", 2)]["cached_tokens"] > 0  # its prompt cache reused turn 1
        assert all(rows[(label, s, t)]["identical_to_baseline"] is not None for s in ("json", "tool") for t in (1, 2))
    # the schema in its json_schema field held (its JSON may hold whitespace), the call in its grammar field
    assert [rows[("llama-server+schema", s, t)]["constrained"] for s, t in rows_order()] == [True, True, True, False]
    tok = load_model(str(path), "fp32", progress=False).tokenizer
    answer = "".join(tok.decode(rows[("llama-server+schema", "json", 1)]["token_ids"]).split())
    assert answer.startswith('{"na')
    call = tok.decode(rows[("llama-server+schema", "tool", 1)]["token_ids"])  # its grammar field held the call
    assert call == '<tool_call>\n{"name": "lookup", "arguments": {"key": "'[:len(call)] and len(call) >= 5
    assert "| llama-server TTFT s |" in (out / "report.md").read_text()


def rows_order():
    return [("json", 1), ("json", 2), ("tool", 1), ("tool", 2)]


def test_a_failed_session_run_is_reported_not_hidden(tiny_model, session_file, monkeypatch):
    real = session_bench.run_session

    def failing(engine, session, max_tokens, spec=None, grammars=None):
        if spec is not None and spec.enabled:
            raise RuntimeError("token 7 was emitted where the grammar forbids it\nthe parser's state ...")
        return real(engine, session, max_tokens, spec, grammars)

    monkeypatch.setattr(session_bench, "run_session", failing)
    section = run_sessions(tiny_model, load_sessions(session_file)[:1], parse_methods("none,ngram-simple",
                           model=tiny_model), "on", 6, "off", ctx_size=512, progress=False)
    assert section["errors"] == [{"config": "ngram-simple", "session": "json",
                                  "error": "token 7 was emitted where the grammar forbids it"}]
    assert {s["config"]: s["identical"] for s in section["summary"]} == {"none": True, "ngram-simple": False}
    assert "- ngram-simple | json: token 7 was emitted" in "\n".join(sessions_markdown(section))


def test_llama_servers_answer_is_compared_without_its_eos(tiny_model, session_file):
    """llama-server's /completion tokens end with the EOS that ended the answer; specdec's output does not hold
    it, so the peer's turn drops it (else "same" read NO on every finished turn); timings and cache counts are
    its own."""
    import httpx

    from specdec.bench.session_peer import LlamaServerSessions

    sent = []

    def answer(request):
        sent.append(request.url.path)
        if request.url.path == "/slots/0":
            return httpx.Response(200, json={"id_slot": 0})
        body = json.loads(request.content)
        return httpx.Response(200, json={"tokens": [40, 41, 2], "timings": {
            "prompt_n": len(body["prompt"]) - 3, "prompt_ms": 12.0, "predicted_ms": 20.0, "predicted_n": 3}})

    client = httpx.Client(transport=httpx.MockTransport(answer))
    peer = LlamaServerSessions(tiny_model.tokenizer, "http://peer", client=client)
    turns = peer.run_session(load_sessions(session_file)[0], 6, constrained=True)
    assert sent == ["/slots/0", "/completion", "/completion"]  # the slot erased before the session
    assert [t.token_ids for t in turns] == [(40, 41), (40, 41)]
    assert [t.cached_tokens for t in turns] == [3, 3] and turns[0].ttft_s == 0.012 and turns[0].constrained
