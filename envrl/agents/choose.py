"""``choose`` mode: the policy scores every admissible action as its response and samples one.

A small model, or one trained from scratch, rarely writes a well-formed valid action; scoring
the admissible actions instead lets it act validly from the first step, as in the
"choose among candidates" policies of text-game RL. Each candidate is the response that gives
that action in the prompt template's format (``<action>go north</action>`` plus the model's
end-of-turn token), and its score is the sum of its tokens' log-probabilities given the prompt:

    score(a) = sum_j log p(y_j | prompt, y_<j),   pi(a | s) = softmax_a(score(a) / temperature)

or, with ``score="mean"``, that sum divided by the candidate's length (the length-normalised
score of multiple-choice evaluation): a model trained from scratch starts near a uniform
choice instead of always picking the shortest action, since every token costs it about the
same log-probability.

Scoring is packed: a prompt and all its candidates form one row, the prompt first and the
candidates after it, with an attention mask under which each candidate's tokens see the prompt
and their own earlier tokens only, and position ids that start every candidate right after the
prompt. Each candidate is thus scored exactly as if it followed the prompt alone, the prompt is
computed once, and many prompts' rows go through the model in one forward pass (rollouts score
a whole batch of envs at once, training a whole micro-batch), which is what makes scoring tens
of actions for tens of envs affordable. :func:`score_candidate_sets` keeps the autograd graph,
so training differentiates ``log pi(a | s)`` through exactly the computation that chose ``a``.
The mask is a 4D float mask, which transformers' ``eager`` and ``sdpa`` attention accept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

#: how a candidate's token log-probs make its score
CHOOSE_SCORES = ("sum", "mean")
#: candidates packed into one row (a longer list is split over several rows, each with its own copy of the prompt)
CANDIDATE_CHUNK = 64
#: rows times padded length of one forward pass (a bigger batch is split)
PACKED_TOKENS = 16384


def score_candidates(model: Any, prompt_ids: Sequence[int], candidates: Sequence[Sequence[int]], pad_id: int) -> Any:
    """``[n, width]`` log-probabilities of each candidate's tokens given the prompt (0 past its end).

    The score of candidate ``i`` is row ``i``'s sum. One prompt's case of :func:`score_candidate_sets`.
    """
    return score_candidate_sets(model, [(prompt_ids, candidates)], pad_id)[0]


def score_candidate_sets(
    model: Any, items: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]], pad_id: int
) -> list[Any]:
    """For each ``(prompt_ids, candidates)`` item, the ``[n, width]`` log-probabilities of its
    candidates' tokens given its prompt (0 past each candidate's end; ``width`` its longest).

    Runs ``model`` with gradients when the caller has them on (training), so wrap it in
    ``torch.inference_mode()`` to act.
    """
    import torch

    for prompt, candidates in items:
        if not prompt or not candidates or any(len(c) == 0 for c in candidates):
            raise ValueError("scoring needs a prompt and at least one candidate, each of at least one token")
    device = next(model.parameters()).device
    rows = [  # (item, first candidate's index, the candidates of the row)
        (k, start, candidates[start : start + CANDIDATE_CHUNK])
        for k, (_, candidates) in enumerate(items)
        for start in range(0, len(candidates), CANDIDATE_CHUNK)
    ]
    lengths = [len(items[k][0]) + sum(len(c) for c in chunk) for k, _, chunk in rows]
    # per item: the flat token log-probs of its candidates in order, gathered from every row
    flat: list[list[Any]] = [[] for _ in items]
    batch: list[int] = []
    for r in sorted(range(len(rows)), key=lambda r: lengths[r]) + [-1]:
        if r >= 0 and (not batch or (len(batch) + 1) * max(lengths[r], lengths[batch[-1]]) <= PACKED_TOKENS):
            batch.append(r)
            continue
        if batch:
            for row, values in zip(batch, _score_rows(model, items, [rows[b] for b in batch], pad_id, device)):
                flat[rows[row][0]].append((rows[row][1], values))
        batch = [r] if r >= 0 else []
    out = []
    for (_, candidates), parts in zip(items, flat):
        values = torch.cat([v for _, v in sorted(parts, key=lambda part: part[0])])
        width = max(len(c) for c in candidates)
        row_index = torch.tensor([i for i, c in enumerate(candidates) for _ in c], device=device)
        column = torch.tensor([j for c in candidates for j in range(len(c))], device=device)
        grid = torch.zeros((len(candidates), width), dtype=torch.float32, device=device)
        out.append(grid.index_put((row_index, column), values))
    return out


def _score_rows(
    model: Any,
    items: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]],
    rows: Sequence[tuple[int, int, Sequence[Sequence[int]]]],
    pad_id: int,
    device: Any,
) -> list[Any]:
    """One forward over packed rows (see the module docstring); per row, its candidates' token
    log-probs, flat, candidate after candidate."""
    import torch

    packed, positions, owners = [], [], []
    for k, _, chunk in rows:
        prompt = list(items[k][0])
        ids, pos, owner = list(prompt), list(range(len(prompt))), [-1] * len(prompt)
        for j, tokens in enumerate(chunk):
            ids += list(tokens)
            pos += range(len(prompt), len(prompt) + len(tokens))
            owner += [j] * len(tokens)
        packed.append(ids)
        positions.append(pos)
        owners.append(owner)
    # left-padded, so that every row's candidates sit at its end and the model computes logits
    # only for the last ``keep`` positions (the vocabulary projection is a large share of the work)
    width = max(len(ids) for ids in packed)
    n = len(packed)
    ids_t = torch.full((n, width), pad_id, dtype=torch.long)
    pos_t = torch.zeros((n, width), dtype=torch.long)
    owner_t = torch.full((n, width), -2, dtype=torch.long)  # -2: padding, -1: the prompt, j: candidate j
    for row in range(n):
        length = len(packed[row])
        ids_t[row, width - length :] = torch.tensor(packed[row])
        pos_t[row, width - length :] = torch.tensor(positions[row])
        owner_t[row, width - length :] = torch.tensor(owners[row])
    query, key = owner_t.unsqueeze(2), owner_t.unsqueeze(1)
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    allowed = causal & (key != -2) & ((key == -1) | (key == query))
    allowed |= torch.eye(width, dtype=torch.bool)  # padding attends to itself: no row is all masked
    mask = torch.zeros((n, 1, width, width), dtype=torch.float32)
    mask.masked_fill_(~allowed.unsqueeze(1), torch.finfo(torch.float32).min)
    keep = max(sum(len(tokens) for tokens in chunk) for _, _, chunk in rows) + 1
    logits = model(
        input_ids=ids_t.to(device),
        attention_mask=mask.to(device),
        position_ids=pos_t.to(device),
        logits_to_keep=keep,
    ).logits
    # candidate token t of a row is predicted at the prompt's last position (its first token) or
    # at the position of the candidate's previous token; column c of ``logits`` is row position width - keep + c
    rows_index, predictors, targets = [], [], []
    for row, (k, _, chunk) in enumerate(rows):
        prompt_end = width - len(packed[row]) + len(items[k][0]) - (width - keep)  # first candidate token's column
        cursor = prompt_end
        for tokens in chunk:
            predictors += [prompt_end - 1] + list(range(cursor, cursor + len(tokens) - 1))
            rows_index += [row] * len(tokens)
            targets += list(tokens)
            cursor += len(tokens)
    selected = logits[torch.tensor(rows_index, device=device), torch.tensor(predictors, device=device)]
    token_logprobs = torch.log_softmax(selected.float(), dim=-1)
    token_logprobs = token_logprobs.gather(-1, torch.tensor(targets, device=device).unsqueeze(-1)).squeeze(-1)
    counts = [sum(len(tokens) for tokens in chunk) for _, _, chunk in rows]
    return list(torch.split(token_logprobs, counts))


def candidate_scores(token_logprobs: Any, candidates: Sequence[Sequence[int]], score: str = "sum") -> Any:
    """``[n]`` scores from :func:`score_candidates`' rows: their sum, or their mean over each
    candidate's tokens (``score="mean"``)."""
    import torch

    if score not in CHOOSE_SCORES:
        raise ValueError(f"choose score must be one of {', '.join(CHOOSE_SCORES)}, got {score!r}")
    total = token_logprobs.sum(dim=1)
    if score == "sum":
        return total
    lengths = torch.tensor([len(c) for c in candidates], dtype=total.dtype, device=total.device)
    return total / lengths


def choice_distribution(scores: Any, temperature: float) -> Any:
    """``log pi(. | s)``: log-softmax of the scores divided by the temperature (1 when greedy)."""
    import torch

    return torch.log_softmax(scores.float() / (temperature if temperature > 0 else 1.0), dim=-1)


def sample_choice(log_probs: np.ndarray, temperature: float, seed: int | None) -> int:
    """The chosen index: the argmax when greedy (the first on ties), else a draw from ``exp(log_probs)``
    with a generator seeded by ``seed`` (repeatable, and independent of torch's global RNG)."""
    if temperature == 0:
        return int(np.argmax(log_probs))
    probs = np.exp(log_probs - log_probs.max())
    probs /= probs.sum()
    return int(np.random.default_rng(seed).choice(len(probs), p=probs))
