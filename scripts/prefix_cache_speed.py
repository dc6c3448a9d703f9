"""Time to first token of a repeated ~380-token chat prompt, cold vs warm, in each prefix cache mode, on
qwen2.5-coder-1.5b (gguf): docs/measurements/prefix-cache.md.

    python scripts/prefix_cache_speed.py on exact off
"""

import sys
import time

from specdec.engine.engine import Engine
from specdec.model.load import load_model
from specdec.sampling import SamplingParams

model = load_model("qwen2.5-coder-1.5b", "gguf", progress=False)
tok = model.tokenizer
system = ("You are a coding agent working in a Python repository. You may call the tools read_file(path), "
          "write_file(path, text), run_tests(paths) and search(pattern). Answer with one tool call as JSON, "
          "{\"tool\": name, \"arguments\": {...}}, and nothing else. Keep edits small; run the tests after each "
          "edit; never delete a test. ")
code = "\n".join(f"def handler_{i}(request, context):\n    value = context.lookup(request.key_{i})\n"
                 f"    return value * {i} if value is not None else None\n" for i in range(9))
messages = [{"role": "system", "content": system + code}, {"role": "user", "content": "Add a docstring to handler_3."}]
prompt = tok.encode(tok.apply_chat_template(messages), add_bos=False)
print("prompt tokens", len(prompt), file=sys.stderr)

def once(engine, ids):
    req = engine.admit(ids, SamplingParams(), 1)
    t = time.perf_counter()
    while not req.finished:
        engine.step_batch([req])
    dt = time.perf_counter() - t
    engine.finish(req)
    return dt, req.cached_tokens, req.output

for mode in sys.argv[1:]:
    engine = Engine(model, max_len=1024, max_sequences=2, prefix_cache=mode)
    once(engine, tok.encode("warm up the kernels", add_bos=False))
    cold = once(engine, prompt)
    warm = [once(engine, prompt) for _ in range(3)]
    turn = prompt + tok.encode("<|im_start|>user\nNow run the tests.<|im_end|>\n", add_bos=False)
    nxt = once(engine, turn)
    print(f"{mode}: cold {cold[0]:.3f}s (cached {cold[1]}); warm same prompt {min(w[0] for w in warm):.3f}s "
          f"(cached {warm[0][1]}, same first token {warm[0][2] == cold[2]}); next turn {nxt[0]:.3f}s "
          f"(cached {nxt[1]} of {len(turn)})")
