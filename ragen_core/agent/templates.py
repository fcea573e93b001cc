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


def base_chat_template(template: Any) -> Any:
    """``template`` without an export's reply-prefix block (unchanged when it has none or is not a string)."""
    if not isinstance(template, str) or PREFIX_BLOCK_MARK not in template:
        return template
    return template[: template.rindex(PREFIX_BLOCK_MARK)]


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
