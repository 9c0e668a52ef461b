"""ENVRL's inverse-dynamics target is the action's tokens only (issue #28): the response format's
text before the action ends the prompt, the closing tag and the end-of-turn token are not scored,
and the tokens are the ones the policy writes (the response tokenized whole).

The token pieces below are the tiny checkpoint's (tests/tiny_lm.py, a byte-level BPE trained on
a fixed corpus, the same on every run), read off by hand: ``open chest`` is ``open``, `` c``,
``he``, ``st`` after a ``>`` of its own, while ``take`` merges with the tag's ``>`` into ``>t``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from envrl.agents.prompts import TemplateError, load_template  # noqa: E402
from envrl.training.config import PolicyConfig  # noqa: E402
from envrl.training.dynamics import (  # noqa: E402
    TargetSample,
    action_span,
    inverse_dynamics_messages,
    inverse_dynamics_sample,
    load_world_model_template,
)
from envrl.training.policy import Policy, token_bounds  # noqa: E402

MESSAGES = [
    {"role": "system", "content": "Play the text game: one action per turn."},
    {"role": "user", "content": "Task: Take the key.\n\nYou open the chest, revealing a key."},
]
NEXT = "You take the key from the chest."
#: the shipped templates' response formats: compact (the CPU runs') and think-action (the default)
PREFIXES = {"compact": "<action>", "think-action": "<think></think><action>"}


def _policy(checkpoint: Path, template: str) -> Policy:
    return Policy(PolicyConfig(model=str(checkpoint), device="cpu", template=template, history=1), "textworld")


def _sample(policy: Policy, action: str, template: str = "follow-up-inverse-dynamics") -> TargetSample:
    id_template = load_world_model_template(template)
    state = ("Take the key.", [], "O", NEXT)
    return inverse_dynamics_sample(
        policy, id_template, *state, action, state_messages=MESSAGES, state_ids=policy.encode_prompt(MESSAGES)
    )


def _pieces(policy: Policy, ids: list[int]) -> list[str]:
    return [policy.tokenizer.decode([i]) for i in ids]


def test_the_shipped_formats_put_the_action_between_their_tags() -> None:
    assert action_span(load_template("compact"), "open chest") == ("<action>open chest</action>", 8, 18)
    assert action_span(load_template("think-action"), "look") == ("<think></think><action>look</action>", 23, 27)
    writes_none = SimpleNamespace(name="odd", format_response=lambda action: "<action></action>")
    with pytest.raises(TemplateError, match="'odd' writes responses without their action"):
        action_span(writes_none, "look")


@pytest.mark.parametrize("template", ["compact", "think-action"])
def test_the_id_target_is_the_action_and_the_tags_are_not_scored(template: str, tiny_checkpoint: Path) -> None:
    policy = _policy(tiny_checkpoint, template)
    prefix = PREFIXES[template]
    sample = _sample(policy, "open chest")
    assert sample.kind == "inverse_dynamics"
    assert policy.tokenizer.decode(sample.response_ids) == "open chest"
    assert _pieces(policy, sample.response_ids) == ["open", " c", "he", "st"]
    assert policy.end_id not in sample.response_ids  # the end-of-turn token is not the action's
    # the format's text before the action ends the prompt: the follow-up prompt, then the prefix's tokens
    id_messages = [
        *MESSAGES,
        {"role": "assistant", "content": prefix + "?</action>"},
        {"role": "user", "content": NEXT + "\n\nWhich action is the '?'?"},
    ]
    question = policy.encode_prompt(id_messages)
    prefix_ids = policy.tokenizer(prefix, add_special_tokens=False)["input_ids"]
    assert sample.prompt_ids == question + prefix_ids
    assert policy.tokenizer.decode(sample.prompt_ids[len(question) :]) == prefix
    # and the row is the policy's own answer cut after the action, token for token: only
    # "</action>" and the end-of-turn token are dropped
    whole = policy.encode_response(prefix + "open chest</action>")
    assert sample.prompt_ids + sample.response_ids + whole[-4:] == question + whole
    assert policy.tokenizer.decode(whole[-4:-1]) == "</action>" and whole[-1] == policy.end_id
    with torch.no_grad():
        scores = policy.logprobs([sample], temperature=1.0)
    assert scores.mask.sum().item() == 4


def test_a_token_bpe_merged_across_the_tag_is_scored_as_the_actions(tiny_checkpoint: Path) -> None:
    """``<action>take`` is ``<``, ``action``, ``>t``: ``>t`` writes the action's first letter, so it is
    scored (splitting it would change the policy's tokens); ``<action`` ends the prompt."""
    policy = _policy(tiny_checkpoint, "compact")
    sample = _sample(policy, "take key from chest")
    assert _pieces(policy, sample.response_ids) == [">t", "ak", "e", " key", " from", " c", "he", "st"]
    assert _pieces(policy, sample.prompt_ids[-3:]) == ["\n", "<", "action"]
    whole = policy.encode_response("<action>take key from chest</action>")
    assert sample.prompt_ids[-2:] + sample.response_ids == whole[:-4]


def test_id_scores_are_the_action_tokens_of_the_whole_answer(tiny_checkpoint: Path) -> None:
    """Moving the prefix into the prompt and dropping the suffix changes no scored log-prob: they
    are the action's tokens' log-probs in the row prompt + whole answer (the standalone
    envrl-inverse-dynamics prompt here, a row of its own)."""
    policy = _policy(tiny_checkpoint, "think-action")
    sample = _sample(policy, "open chest", "envrl-inverse-dynamics")
    id_template = load_world_model_template("envrl-inverse-dynamics")
    question = policy.encode_prompt(
        inverse_dynamics_messages(id_template, policy.template, 1, "Take the key.", [], "O", NEXT)
    )
    assert policy.tokenizer.decode(sample.prompt_ids[len(question) :]) == "<think></think><action>"
    whole = TargetSample(question, policy.encode_response("<think></think><action>open chest</action>"), "x")
    with torch.no_grad():
        ours = policy.logprobs([sample], temperature=1.0)
        full = policy.logprobs([whole], temperature=1.0)
    start = len(sample.prompt_ids) - len(question)
    count = len(sample.response_ids)
    assert count == 4
    assert torch.allclose(ours.logprobs[0, :count], full.logprobs[0, start : start + count], atol=1e-5)


def test_an_empty_action_has_no_target(tiny_checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="needs an action"):
        _sample(_policy(tiny_checkpoint, "compact"), "")


def test_response_spans_from_offsets_or_decoding_agree(tiny_checkpoint: Path) -> None:
    policy = _policy(tiny_checkpoint, "compact")
    text = "<think></think><action>go  east</action>"
    ids, first, last = policy.encode_response_span(text, 23, 31)
    assert _pieces(policy, ids[first:last]) == [">go", " ", " ", "e", "as", "t"]
    assert (first, last, ids[-1]) == (6, 12, policy.end_id)
    assert policy.encode_response_span(text, 23, 23)[1:] == (6, 6)  # an empty span: no tokens

    class Slow:
        """The same tokenizer seen as a slow one: no offsets, bounds from decoded prefixes."""

        is_fast = False
        decode = staticmethod(policy.tokenizer.decode)

    tokens = ids[:-1]
    assert token_bounds(Slow(), text, tokens) == token_bounds(policy.tokenizer, text, tokens)
    assert token_bounds(policy.tokenizer, text, tokens)[6] == (22, 25)  # ">go": the tag's ">" and "go"


# ---- the one template loader ----------------------------------------------------------------------


def test_every_shipped_training_template_is_read_by_the_one_loader() -> None:
    """Each JSON file of envrl/training/templates is a built-in of one kind, found through
    :func:`envrl.training.templates.load_template` whatever its kind."""
    from envrl.training.dynamics import BUILTIN_WORLD_MODEL_TEMPLATES
    from envrl.training.rationales import load_rationale_template
    from envrl.training.templates import template_file

    folder = Path(str(template_file("")))
    shipped = {path.name for path in folder.glob("*.json")}
    assert shipped == {*BUILTIN_WORLD_MODEL_TEMPLATES.values(), "rationale.json"}
    for name, file in BUILTIN_WORLD_MODEL_TEMPLATES.items():
        template = load_world_model_template(name)
        assert (template.name, template.source) == (file.removesuffix(".json").replace("_", "-"), f"builtin:{name}")
    assert load_rationale_template("rationale").source == "builtin:rationale"


def test_the_loader_reads_a_path_and_refuses_in_one_sentence(tmp_path: Path) -> None:
    from envrl.training.templates import load_template as load_training_template

    builtins = {"mine": "world_model.json"}
    good = tmp_path / "t.json"
    good.write_text('{"a": 1}', encoding="utf-8")
    assert load_training_template(good, builtins=builtins, label="toy template") == ({"a": 1}, str(good))
    data, source = load_training_template("mine", builtins=builtins, label="toy template")
    assert source == "builtin:mine" and data["kind"] == "state-prediction"
    with pytest.raises(KeyError, match=r"^\"unknown toy template 'nope': not one of mine and no such file\"$"):
        load_training_template("nope", builtins=builtins, label="toy template", error=KeyError)
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    with pytest.raises(TemplateError, match=rf"^world-model template {tmp_path / 'bad.json'} is not valid JSON: "):
        load_world_model_template(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1]", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^toy template {tmp_path / 'list.json'} must be a JSON object$"):
        load_training_template(tmp_path / "list.json", builtins=builtins, label="toy template")


def test_no_module_reads_the_training_templates_folder_itself() -> None:
    """The loader is the only reader of envrl/training/templates: no other module opens it."""
    root = Path(__file__).resolve().parents[1] / "envrl"
    readers = [
        path.relative_to(root).as_posix()
        for path in root.rglob("*.py")
        if 'joinpath("templates")' in path.read_text(encoding="utf-8") and "training" in path.parts
    ]
    assert readers == []
