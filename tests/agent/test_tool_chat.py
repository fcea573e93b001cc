"""The tiny model's chat template with tools, and a tool env's chat built token-exactly: the template renders every
chat without tools as the ChatML template before it did (so no prompt of any existing env changes), renders tools as
Qwen2.5's does (written out by hand below), and a template that would rewrite what the model saw is refused."""

from __future__ import annotations

import copy

import pytest

from ragen_core.agent import ChatFormatter, TemplateError, ToolChat, base_chat_template
from ragen_core.agent.prompts import SYSTEM_PROMPT
from ragen_core.agent.templates import CHATML_TEMPLATE, TINY_CHAT_TEMPLATE
from ragen_core.envs import make_env
from ragen_core.rollout.engine import opening_message

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    },
}


def _render(tokenizer, template, messages, tools=None, generation=True):
    return tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=generation
    )


def _chats():
    """Chats of every shape the existing envs' prompts take: with and without a system message, several turns."""
    chats = []
    for name in ("bandit", "frozen_lake", "sokoban", "countdown"):
        env = make_env(name)
        state, _ = env.reset(1)
        first = opening_message(env, state, 10, 2, True, "full")
        chats.append([{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": first}])
        chats.append([{"role": "user", "content": first}, {"role": "assistant", "content": "<think>x</think>"}])
        chats.append([*chats[-2], {"role": "assistant", "content": "a"}, {"role": "user", "content": state}])
    return chats


def test_without_tools_the_template_renders_as_chatml_did(tiny_policy):
    tokenizer = tiny_policy[1]
    assert tokenizer.chat_template == TINY_CHAT_TEMPLATE
    for chat in _chats():
        for generation in (True, False):
            assert _render(tokenizer, TINY_CHAT_TEMPLATE, chat, None, generation) == _render(
                tokenizer, CHATML_TEMPLATE, chat, None, generation
            )
    assert base_chat_template(CHATML_TEMPLATE) == TINY_CHAT_TEMPLATE  # a folder built before tools gets them


def test_tools_render_as_qwen2_5_s_template_does(tiny_policy):
    tokenizer = tiny_policy[1]
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1 + 2?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}],
        },
        {"role": "tool", "content": "3"},
        {"role": "tool", "content": "4"},
        {"role": "assistant", "content": "3"},
    ]
    schema = (
        '{"type": "function", "function": {"name": "add", "description": "Add two numbers.", "parameters": '
        '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}'
    )
    expected = (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query."
        "\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        f"{schema}\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n1 + 2?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n3\n</tool_response>\n<tool_response>\n4\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n3<|im_end|>\n<|im_start|>assistant\n"
    )
    assert _render(tokenizer, TINY_CHAT_TEMPLATE, chat, [ADD]) == expected
    # without a system message the tools open the chat alone (no default system text of its own)
    alone = _render(tokenizer, TINY_CHAT_TEMPLATE, chat[1:2], [ADD])
    assert alone.startswith("<|im_start|>system\n# Tools\n\n") and alone.endswith(
        "<|im_start|>user\n1 + 2?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_the_delta_of_new_messages_is_what_the_template_appends(tiny_policy):
    tokenizer = tiny_policy[1]
    chat = ToolChat(ChatFormatter(tokenizer, style="compact"), [ADD])
    messages, prompt = chat.start("Add 1.")
    reply = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    seen = chat.seen_after(prompt, reply, finished=True)
    new = [{"role": "tool", "content": "1"}]
    delta = chat.delta(messages, reply, seen, new)
    assert delta == "\n<|im_start|>user\n<tool_response>\n1\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    whole = [*messages, {"role": "assistant", "content": reply}, *new]
    assert seen + delta == _render(tokenizer, TINY_CHAT_TEMPLATE, whole, [ADD])
    cut = chat.seen_after(prompt, reply[:20], finished=False)  # a reply cut at the limit: its end marker follows
    assert chat.delta(messages, reply[:20], cut, new).startswith("<|im_end|>\n<|im_start|>user\n<tool_response>")


def thinking_dropped(tokenizer):
    """A copy of ``tokenizer`` whose template drops the thinking of assistant turns, as some reasoning models' do:
    a rendering with a new turn rewrites the reply the model wrote."""
    dropping = copy.copy(tokenizer)
    content = "message['content']"
    dropping.chat_template = TINY_CHAT_TEMPLATE.replace(
        f"'\\n' + {content} + '<|im_end|>'", f"'\\n' + {content}.split('</think>')[-1] + '<|im_end|>'"
    )
    assert dropping.chat_template != TINY_CHAT_TEMPLATE
    return dropping


def test_a_template_that_rewrites_what_the_model_saw_is_refused_before_a_reply(tiny_policy):
    chat = ToolChat(ChatFormatter(thinking_dropped(tiny_policy[1]), reply_prefix="<think>"), [ADD])
    with pytest.raises(TemplateError) as caught:
        chat.start("Add 1.")
    message = str(caught.value)
    assert message.startswith("the model's chat template is not prefix-preserving") and "\n" not in message
    assert "became 'probe<|im_end|>" in message  # where it rewrote: the probe reply's thinking is gone


def test_each_delta_is_checked_too(tiny_policy):
    formatter = ChatFormatter(tiny_policy[1], reply_prefix="<think>")
    chat = ToolChat(formatter, [ADD])
    messages, prompt = chat.start("Add 1.")  # the tiny template passes the probe
    reply = '<think>one</think><tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    seen = chat.seen_after(prompt, reply[len("<think>") :], finished=True)
    assert chat.delta(messages, reply, seen, [{"role": "tool", "content": "1"}]).startswith("\n<|im_start|>user")
    formatter.chat_template = thinking_dropped(tiny_policy[1]).chat_template  # a template that rewrites, now
    with pytest.raises(
        TemplateError, match=r"^the model.s chat template is not prefix-preserving: .* \(at character \d+: "
    ):
        chat.delta(messages, reply, seen, [{"role": "tool", "content": "1"}])


def test_a_template_that_ignores_the_tools_is_refused(tiny_policy):
    tokenizer = copy.copy(tiny_policy[1])
    tokenizer.chat_template = "{%- for m in messages %}{{ m['content'] }}{%- endfor %}"
    with pytest.raises(TemplateError, match="does not render the tools \\(no 'add' in the prompt\\)"):
        ToolChat(ChatFormatter(tokenizer), [ADD]).start("Add 1.")
