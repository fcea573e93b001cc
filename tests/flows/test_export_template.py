"""A checkpoint's Hugging Face export is self-contained: on a real run (tests/flows/test_resume.py's reference run,
thinking on with the ``<think>`` prefix), plain transformers prompted through the export's own chat template gives
the run's stored prompt ids and the reply the run's own policy gives from them."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ragen_core.agent.prompts import SYSTEM_PROMPT
from ragen_core.storage import DataLake
from tests.flows.test_resume import RUN

NEW_TOKENS = 12


@pytest.fixture(scope="module")
def export_and_prompts(whole_bandit_run):
    """The run's last export and its stored first-turn prompts: (observation, prompt ids) per trajectory."""
    lake = DataLake(whole_bandit_run)
    folder = lake.checkpoint_dir(RUN, 3) / "hf"
    trajectories = lake.read_table(
        "trajectories", RUN, columns=["env", "group_id", "traj_index", "split", "iteration", "input_ids", "loss_mask"]
    )
    turns = lake.read_table("turns", RUN)
    turns = turns.filter(pc.equal(turns["turn_index"], 0)).to_pylist()
    first = {(t["iteration"], t["split"], t["env"], t["group_id"], t["traj_index"]): t["observation"] for t in turns}
    prompts = []
    for row in trajectories.to_pylist():
        reply_start = row["loss_mask"].index(1)  # the prompt: every id before the first one the policy produced
        key = (row["iteration"], row["split"], row["env"], row["group_id"], row["traj_index"])
        prompts.append((first[key], row["input_ids"][:reply_start]))
    return folder, prompts


def test_the_export_template_gives_the_stored_prompt_ids(export_and_prompts):
    folder, prompts = export_and_prompts
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert len({tuple(ids) for _, ids in prompts}) > 1  # several distinct prompts, not one repeated
    for observation, stored in prompts:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": observation}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert list(ids) == stored
    assert tokenizer.decode(stored).endswith("<|im_start|>assistant\n<think>")  # what the template had to add


def test_greedy_generation_from_the_export_is_the_run_policys_reply(export_and_prompts):
    """Plain transformers (the export's model, tokenizer and template) against the run's own generation path (its
    rollout backend, top-k 1) from the stored prompt ids."""
    from ragen_core.policy import load_policy
    from ragen_core.rollout.hf_backend import HFBackend
    from ragen_core.rollout.types import TurnContext

    folder, prompts = export_and_prompts
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    policy, run_tokenizer = load_policy(folder)
    backend = HFBackend(policy.eval(), run_tokenizer, 1.0, NEW_TOKENS, top_p=1.0, top_k=1)
    seen = set()
    for observation, stored in prompts:
        if tuple(stored) in seen:
            continue
        seen.add(tuple(stored))
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": observation}]
        inputs = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            output = model.generate(
                **inputs,
                do_sample=False,
                max_new_tokens=NEW_TOKENS,
                eos_token_id=backend.stop_ids,
                pad_token_id=tokenizer.pad_token_id,
            )
        plain = output[0, inputs["input_ids"].shape[1] :].tolist()
        backend.reset()
        context = TurnContext(list(stored), None, 1, 1, True, "<think>")
        (generation,) = backend.generate([context], seed=0)
        assert plain == generation.token_ids
