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
a whole batch of envs at once, training a whole micro-batch; rows of similar length together,
:func:`length_buckets`), which is what makes scoring tens of actions for tens of envs affordable.
The same packing scores any rows that share their start (ENVRL's SP and ID rows beside a step's
candidates or response): the shared start is the prompt, and each row's own rest of the prompt is
context before its scored tokens (``score_from``). :func:`score_candidate_sets` keeps the autograd graph,
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
#: rows times padded length of one forward pass on an accelerator (a bigger batch is split)
PACKED_TOKENS = 16384
#: the same on a CPU, where passes of a few thousand tokens keep their activations and masks in the
#: caches: with 2048 instead of 16384, ENVRL's choose-mode update took 13.9 s instead of 15.2 s and
#: generate-mode GRPO's 14.8 s instead of 17.3 s (``benchmarks/envrl_overhead.py``, one thread)
CPU_PACKED_TOKENS = 2048
#: the share of padding a forward over rows of different lengths may add to their tokens (see :func:`length_buckets`)
PADDING_SLACK = 0.25


def length_buckets(lengths: Sequence[int], slack: float = PADDING_SLACK) -> list[list[int]]:
    """The indices of ``lengths`` in groups to run as one padded forward each: in increasing
    length, a row joins the current group while the group's padded size (rows x its longest)
    stays within ``1 + slack`` times its tokens, so padding is at most ``slack / (1 + slack)``
    of the positions computed. Rows of equal length always share a group; every index appears
    once, and each group lists its rows shortest first."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    buckets: list[list[int]] = []
    tokens = 0
    for i in order:
        if buckets and (len(buckets[-1]) + 1) * lengths[i] <= (1.0 + slack) * (tokens + lengths[i]):
            buckets[-1].append(i)
            tokens += lengths[i]
        else:
            buckets.append([i])
            tokens = lengths[i]
    return buckets


def score_candidates(model: Any, prompt_ids: Sequence[int], candidates: Sequence[Sequence[int]], pad_id: int) -> Any:
    """``[n, width]`` log-probabilities of each candidate's tokens given the prompt (0 past its end).

    The score of candidate ``i`` is row ``i``'s sum. One prompt's case of :func:`score_candidate_sets`.
    """
    return score_candidate_sets(model, [(prompt_ids, candidates)], pad_id)[0]


def score_candidate_sets(
    model: Any,
    items: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]],
    pad_id: int,
    score_from: Sequence[Sequence[int]] | None = None,
    temperatures: Sequence[Sequence[float]] | None = None,
    entropy: bool = False,
) -> list[Any]:
    """For each ``(prompt_ids, candidates)`` item, the ``[n, width]`` log-probabilities of its
    candidates' tokens given its prompt (0 past each candidate's end; ``width`` its longest).

    ``score_from`` (per item, per candidate; default all 0) scores a candidate from that token
    on: the tokens before it are context that the scored ones see, and only the scored ones are
    returned (a grid as wide as the longest scored part) and get logits. ENVRL uses it for rows
    that share the start of their prompt: the shared start is the prompt, and each row's own rest
    of the prompt is its candidate's context, its response the scored part.

    ``temperatures`` (per item, per candidate; default all 1) divides a candidate's logits, and
    ``entropy=True`` returns ``(grid, entropy grid)`` pairs, each scored token's entropy of the
    distribution it was drawn from: a sampled response scored as one candidate among others
    (ENVRL's rows beside a generate-mode step) gets what a policy-gradient loss needs.

    Runs ``model`` with gradients when the caller has them on (training), so wrap it in
    ``torch.inference_mode()`` to act.
    """
    import torch

    froms = [list(f) for f in score_from] if score_from is not None else [[0] * len(c) for _, c in items]
    if len(froms) != len(items) or any(len(f) != len(c) for f, (_, c) in zip(froms, items)):
        raise ValueError("score_from needs one start per candidate of every item")
    temps = [list(t) for t in temperatures] if temperatures is not None else [[1.0] * len(c) for _, c in items]
    if len(temps) != len(items) or any(len(t) != len(c) for t, (_, c) in zip(temps, items)):
        raise ValueError("temperatures needs one value per candidate of every item")
    for (prompt, candidates), starts in zip(items, froms):
        if not prompt or not candidates or any(len(c) == 0 for c in candidates):
            raise ValueError("scoring needs a prompt and at least one candidate, each of at least one token")
        if any(not 0 <= f < len(c) for f, c in zip(starts, candidates)):
            raise ValueError("a candidate's first scored token must lie within it")
    device = next(model.parameters()).device
    rows = [  # (item, first candidate's index, the candidates of the row, their scored parts' starts, temperatures)
        (
            k,
            start,
            candidates[start : start + CANDIDATE_CHUNK],
            froms[k][start : start + CANDIDATE_CHUNK],
            temps[k][start : start + CANDIDATE_CHUNK],
        )
        for k, (_, candidates) in enumerate(items)
        for start in range(0, len(candidates), CANDIDATE_CHUNK)
    ]
    lengths = [len(items[row[0]][0]) + sum(len(c) for c in row[2]) for row in rows]
    # per item: the flat token log-probs (and entropies) of its candidates in order, gathered from every row
    flat: list[list[Any]] = [[] for _ in items]
    for batch in forward_batches(lengths, device):
        scored_rows = _score_rows(model, items, [rows[b] for b in batch], pad_id, device, entropy)
        for row, values in zip(batch, scored_rows):
            flat[rows[row][0]].append((rows[row][1], values))
    out = []
    for (_, candidates), starts, parts in zip(items, froms, flat):
        ordered = [v for _, v in sorted(parts, key=lambda part: part[0])]
        scored = [len(c) - f for c, f in zip(candidates, starts)]
        row_index = torch.tensor([i for i, n in enumerate(scored) for _ in range(n)], device=device)
        column = torch.tensor([j for n in scored for j in range(n)], device=device)
        grids = []
        for part in range(2 if entropy else 1):
            grid = torch.zeros((len(candidates), max(scored)), dtype=torch.float32, device=device)
            grids.append(grid.index_put((row_index, column), torch.cat([v[part] for v in ordered])))
        out.append(tuple(grids) if entropy else grids[0])
    return out


def forward_batches(lengths: Sequence[int], device: Any) -> list[list[int]]:
    """Rows (by index) to run together on ``device``: :func:`length_buckets` groups (little
    padding), each split where its padded size would pass the device's token budget
    (:data:`PACKED_TOKENS`, :data:`CPU_PACKED_TOKENS`; a longer row runs alone)."""
    budget = CPU_PACKED_TOKENS if getattr(device, "type", str(device)) == "cpu" else PACKED_TOKENS
    batches: list[list[int]] = []
    for bucket in length_buckets(lengths):
        batch: list[int] = []
        for r in bucket:  # shortest first: the newest row is the longest
            if batch and (len(batch) + 1) * lengths[r] > budget:
                batches.append(batch)
                batch = []
            batch.append(r)
        batches.append(batch)
    return batches


def _score_rows(
    model: Any,
    items: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]],
    rows: Sequence[tuple[int, int, Sequence[Sequence[int]], Sequence[int], Sequence[float]]],
    pad_id: int,
    device: Any,
    entropy: bool = False,
) -> list[tuple[Any, ...]]:
    """One forward over packed rows (see the module docstring); per row, its candidates' scored
    token log-probs, flat, candidate after candidate (and their entropies, with ``entropy``).

    A row is laid out as the prompt but its last token, then every candidate's context but its
    last token (its "head"), then the prompt's last token, then every candidate's rest (its
    "tail": the context's last token and the scored tokens), so that every position whose logits
    are needed sits in the row's last columns and the model computes logits for those only. The
    order in the row is free: positions say where each token stands, and the mask lets a token see
    the prompt's tokens and its own candidate's at earlier positions only, so each candidate is
    scored as if it followed the prompt alone.
    """
    import torch

    packed, positions, owners, predictors_in_row, targets_in_row, temps_in_row = [], [], [], [], [], []
    for k, _, chunk, starts, temps in rows:
        prompt = list(items[k][0])
        cuts = [max(f - 1, 0) for f in starts]  # where each candidate's tail begins
        ids, pos, owner = prompt[:-1], list(range(len(prompt) - 1)), [-1] * (len(prompt) - 1)
        for j, (tokens, cut) in enumerate(zip(chunk, cuts)):  # the heads
            ids += tokens[:cut]
            pos += range(len(prompt), len(prompt) + cut)
            owner += [j] * cut
        last = len(ids)  # the prompt's last token: it predicts every candidate's first token
        ids.append(prompt[-1])
        pos.append(len(prompt) - 1)
        owner.append(-1)
        where: list[int] = []  # per candidate, the row index of its tail's first token
        for j, (tokens, cut) in enumerate(zip(chunk, cuts)):  # the tails
            where.append(len(ids))
            ids += tokens[cut:]
            pos += range(len(prompt) + cut, len(prompt) + len(tokens))
            owner += [j] * (len(tokens) - cut)
        predictors, targets, token_temps = [], [], []
        for tokens, f, cut, first, temperature in zip(chunk, starts, cuts, where, temps):
            for t in range(f, len(tokens)):
                # token t is predicted at token t - 1's position (in the tail), token 0 at the prompt's last
                predictors.append(first + t - 1 - cut if t > 0 else last)
                targets.append(tokens[t])
                token_temps.append(float(temperature))
        temps_in_row.append(token_temps)
        packed.append(ids)
        positions.append(pos)
        owners.append(owner)
        predictors_in_row.append(predictors)
        targets_in_row.append(targets)
    # left-padded, so that every row's tails sit at its end and the model computes logits only for
    # the last ``keep`` positions (the vocabulary projection is a large share of the work)
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
    earlier = pos_t.unsqueeze(1) <= pos_t.unsqueeze(2)  # [row, query, key]: the key stands at or before the query
    allowed = earlier & (key != -2) & ((key == -1) | (key == query))
    # padding attends to itself (and by position to the prompt's first token): no row is all masked, and
    # no other token reads a padding position
    allowed |= torch.eye(width, dtype=torch.bool)
    mask = torch.zeros((n, 1, width, width), dtype=torch.float32)
    mask.masked_fill_(~allowed.unsqueeze(1), torch.finfo(torch.float32).min)
    keep = max(len(ids) - min(p) for ids, p in zip(packed, predictors_in_row))
    logits = model(
        input_ids=ids_t.to(device),
        attention_mask=mask.to(device),
        position_ids=pos_t.to(device),
        logits_to_keep=keep,
    ).logits
    # row index x of a row of length L is column keep - L + x of ``logits``: one flat index per scored
    # token. The prompt's last position predicts every whole candidate's first token, so positions
    # repeat: index_select's backward sums repeats in a fixed order, where advanced indexing's
    # (index_put_ with accumulate) adds them from several CPU threads in any order and the gradients
    # then differ in their last bits from run to run
    starts = [row * keep + keep - len(ids) for row, ids in enumerate(packed)]
    flat = torch.tensor([start + x for start, p in zip(starts, predictors_in_row) for x in p], device=device)
    selected = logits.reshape(-1, logits.shape[-1]).index_select(0, flat).float()
    flat_temps = [t for row in temps_in_row for t in row]
    if any(t != 1.0 for t in flat_temps):
        selected = selected / torch.tensor(flat_temps, device=device).unsqueeze(-1)
    log_probs = torch.log_softmax(selected, dim=-1)
    target_ids = torch.tensor([t for row in targets_in_row for t in row], device=device)
    sizes = [len(p) for p in predictors_in_row]
    parts = [torch.split(log_probs.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1), sizes)]
    if entropy:
        parts.append(torch.split(-(log_probs.exp() * log_probs).sum(-1), sizes))
    return list(zip(*parts))


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
