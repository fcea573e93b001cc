"""The export's "how to prompt the policy" for a tool env: the snippet's messages and tools, rendered with the
model's chat template, are the first prompt the run's rollouts sampled from (the tools in the system message)."""

from __future__ import annotations

import json
import re

from ragen_core.agent import ChatFormatter
from ragen_core.config import load_config
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.run.chat import chat_markdown, validation_instance


def test_the_snippet_renders_the_prompt_the_rollouts_sampled_from(tiny_policy):
    tokenizer = tiny_policy[1]
    config = load_config("configs/calculator.yaml")
    text = chat_markdown(config, "calc", None)
    messages = json.loads(re.search(r"^messages = (\[.*?^\])$", text, re.M | re.S).group(1))
    tools = json.loads(re.search(r"^tools = (\[.*?^\])  #", text, re.M | re.S).group(1))
    assert "tools=tools" in text and [t["function"]["name"] for t in tools] == ["calculate", "answer"]
    shown = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    seed = validation_instance(config, "calculator")
    spec = RolloutSpec("calculator", [seed], 1, 1, 1, 4, enable_think=False)
    (record,) = run_rollouts(spec, ScriptedBackend("expert", tokenizer), ChatFormatter(tokenizer, style="compact"), 0)
    prompt = [t for t, m in zip(record.input_ids, record.loss_mask, strict=True) if not m]
    assert tokenizer.decode(prompt) == shown


def test_an_env_without_tools_has_no_tools_in_its_snippet():
    text = chat_markdown(load_config("configs/bandit.yaml"), "b", None)
    assert "tools" not in text
