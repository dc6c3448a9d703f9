"""Chat templates: the Jinja environment a model's template is written for, and Gemma's template for files
that carry none."""

from __future__ import annotations

import json
from datetime import datetime

from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def template_environment():
    """The Jinja environment chat templates are written for: transformers' (sandboxed, trim_blocks and
    lstrip_blocks, {% break %} / {% continue %}, {% generation %} blocks rendered as their body, tojson
    that keeps non-ASCII and the keys' order, raise_exception and strftime_now)."""
    class GenerationBlock(Extension):  # marks the assistant's text for training masks; here only its text
        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    def raise_exception(message):
        raise ValueError(f"chat template: {message}")

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


# Gemma's turn format, for Gemma GGUF files written without `tokenizer.chat_template` (as some
# conversions are): a system message opens the first user turn, the assistant speaks as "model",
# every other message is trimmed. It is Gemma's published format, written here, not read from the file.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% set system = '' %}{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] + '\n\n' %}{% set messages = messages[1:] %}{% endif %}"
    "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('conversation roles must alternate user/assistant/user/...') }}{% endif %}"
    "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ system if loop.first else '' }}{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
