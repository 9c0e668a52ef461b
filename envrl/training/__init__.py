"""Training: the parts every method shares, and one small module per method.

    policy.py       a causal LM (optional LoRA) acting through the agents' prompts, parser and back end
    rollout.py      groups of G envs on one task and seed, stepped together; one sample per step
    advantages.py   GRPO and GiGPO advantages (pure numpy)
    losses.py       PPO clip, KL (k3), entropy, token cross-entropy (pure torch)
    algorithms/     sft, grpo, gigpo, iwm, sr: a config dataclass and the loss, each read like its paper
    loop.py         the shared loop: collect -> advantages -> update -> log -> evaluate -> checkpoint
    checkpoints.py  saving and exact resumption
    config.py       the run's configuration (dataclasses, YAML files, ``--set key=value``)
    data.py         expert datasets (parquet) for SFT
    early_experience.py  Early Experience data: K alternative actions executed from each expert state
    dynamics.py     world-model prompts (state prediction, inverse dynamics) and their token samples
    rationales.py   self-reflection rationale writers (contrast, openai:, hf:) for SR
    templates/      world-model and rationale prompt templates (JSON data)
    scratch_model.py  a from-scratch Qwen2 checkpoint and tokenizer for CPU experiments

``envrl train --algo NAME`` runs :func:`envrl.training.loop.train`. Envs never import this
package; it reaches them through ``gym.make``/``make_vec`` and the ``info`` contract.
"""
