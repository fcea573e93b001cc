"""The chat template a Hugging Face export carries: the model's own template plus the run's reply prefix.

Training prompts end with the reply prefix (``<think>``, see :func:`ragen_core.agent.prompts.reply_prefix`) after
the assistant header, so a model that only saw such prompts must be prompted the same way. An export's template is
the model's template followed by one marked block that appends the prefix to the generation prompt; then plain
``tokenizer.apply_chat_template(messages, add_generation_prompt=True)`` on the export gives the training prompt's
ids exactly. :class:`~ragen_core.agent.prompts.ChatFormatter` renders with the template before that block (it adds
the configured prefix itself), so a run started from an export never doubles the prefix.
"""

from __future__ import annotations

import json
from typing import Any

PREFIX_BLOCK_MARK = "{# ragen: reply prefix of the training prompt #}"

# The tiny default model's template before tools: plain ChatML. Folders built then carry it; it renders every chat
# without tools exactly as TINY_CHAT_TEMPLATE does, which replaces it wherever it is read (base_chat_template).
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
# The tiny default model's template: ChatML, and tools as Qwen2.5's template renders them (the function schemas in
# the system message between <tools> tags, an assistant's tool_calls as <tool_call> blocks, the tool messages as
# <tool_response> blocks of one user turn). A chat without tools renders as CHATML_TEMPLATE does, to the character;
# unlike Qwen2.5's it adds no system message of its own (the compact prompt style has none).
TOOLS_PREAMBLE = (
    "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\\n<tools>"
)
TOOLS_FORMAT = (
    "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    "<args-json-object>}\\n</tool_call><|im_end|>\\n"
)
TINY_CHAT_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    f"{{{{ '{TOOLS_PREAMBLE}' }}}}"
    "{%- for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{%- endfor %}"
    f'{{{{ "{TOOLS_FORMAT}" }}}}'
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{%- endif %}"
    "{{ '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}"
    "{{ '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{ '\\n' + message['content'] }}{%- endif %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- if call['function'] is defined %}{%- set call = call['function'] %}{%- endif %}"
    "{{ '\\n<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' }}"
    "{%- if call['arguments'] is string %}{{ call['arguments'] }}"
    "{%- else %}{{ call['arguments'] | tojson }}{%- endif %}"
    "{{ '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def base_chat_template(template: Any) -> Any:
    """``template`` without an export's reply-prefix block (unchanged when it has none or is not a string); the
    tiny model's template before tools (:data:`CHATML_TEMPLATE`) as the one after (:data:`TINY_CHAT_TEMPLATE`),
    which renders every chat without tools the same."""
    if not isinstance(template, str):
        return template
    if PREFIX_BLOCK_MARK in template:
        template = template[: template.rindex(PREFIX_BLOCK_MARK)]
    return TINY_CHAT_TEMPLATE if template == CHATML_TEMPLATE else template


def export_chat_template(template: Any, reply_prefix: str) -> Any:
    """The template of an export whose training prompts end with ``reply_prefix``: the model's template (an earlier
    block removed) and, for a non-empty prefix, a block that appends it after the generation prompt. Block tags
    without whitespace control, so the model template's own output is kept to the character. A template that is
    not a string (none, or named templates) is returned as it is."""
    base = base_chat_template(template)
    if not isinstance(base, str) or not reply_prefix:
        return base
    literal = json.dumps(reply_prefix)  # ASCII with JSON escapes, which a Jinja string literal reads the same way
    return f"{base}{PREFIX_BLOCK_MARK}{{% if add_generation_prompt %}}{{{{ {literal} }}}}{{% endif %}}"
