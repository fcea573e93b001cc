"""An export's chat template: the model's template plus the reply prefix on the generation prompt, kept to the
character, and read back by the run's own formatter without doubling the prefix."""

from __future__ import annotations

import copy

import pytest

from ragen_core.agent import ChatFormatter, base_chat_template, export_chat_template

MESSAGES = [{"role": "system", "content": "sys"}, {"role": "user", "content": "pick an arm"}]


def _with_template(tokenizer, template):
    changed = copy.copy(tokenizer)
    changed.chat_template = template
    return changed


@pytest.mark.parametrize("prefix", ["<think>", 'say "hi"\\n\n', "é✓"])
def test_the_export_template_is_the_model_template_then_the_prefix(tiny_policy, prefix):
    _, tokenizer = tiny_policy
    exported = _with_template(tokenizer, export_chat_template(tokenizer.chat_template, prefix))
    plain = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert plain.endswith("<|im_start|>assistant\n")  # the tiny model's ChatML header, written out by hand
    rendered = exported.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert rendered == plain + prefix
    # without the generation prompt (a finished conversation) the prefix is not added
    closed = MESSAGES + [{"role": "assistant", "content": "<think>x</think><answer>A</answer>"}]
    finished = tokenizer.apply_chat_template(closed, tokenize=False)
    assert exported.apply_chat_template(closed, tokenize=False) == finished


def test_the_block_is_replaced_not_stacked_and_an_empty_prefix_changes_nothing(tiny_policy):
    _, tokenizer = tiny_policy
    once = export_chat_template(tokenizer.chat_template, "<think>")
    assert export_chat_template(once, "<think>") == once
    assert base_chat_template(once) == tokenizer.chat_template
    assert export_chat_template(once, "") == tokenizer.chat_template
    assert export_chat_template(None, "<think>") is None  # a tokenizer without a template keeps none


def test_the_formatter_on_an_exported_tokenizer_gives_the_training_ids(tiny_policy):
    """A run (or an evaluation) started from an export renders with the model's template and adds its own prefix:
    the same ids as from the original tokenizer, never ``<think><think>``, whatever prefix the export carries."""
    _, tokenizer = tiny_policy
    for exported_prefix in ("<think>", "<other>"):
        exported = _with_template(tokenizer, export_chat_template(tokenizer.chat_template, exported_prefix))
        for prefix in ("<think>", ""):
            ours, theirs = ChatFormatter(tokenizer, reply_prefix=prefix), ChatFormatter(exported, reply_prefix=prefix)
            assert theirs.start("pick an arm") == ours.start("pick an arm")
            assert theirs.continue_after("next", True) == ours.continue_after("next", True)
    start = ChatFormatter(tokenizer, reply_prefix="<think>").start("pick an arm")
    assert tokenizer.decode(start).endswith("<|im_start|>assistant\n<think>")
