"""Rationale writers for self-reflection (SR; Zhang et al., 2025, "Agent Learning via Early Experience").

For an expert state ``s_i``, the expert's action ``a_i`` (which led to ``s_{i+1}``) and an
alternative ``a_i^j`` (which led to ``s_i^j``), a rationale ``c_i^j`` says why ``a_i`` is the
better action. SR then trains the policy to write the rationale and the expert's action
(:mod:`envrl.training.algorithms.sr`). Writers, by spec:

* ``contrast``: offline and deterministic, the same text for the same row. It fills a fixed
  sentence pattern with both observed outcomes (each cut to a few characters): a *template*,
  not a model's reasoning, so it teaches the shape of a reflection and what each action did,
  nothing more. It needs no model, so SR can run it in memory at start.
* ``openai:MODEL[@BASE_URL]``: an OpenAI-compatible server, through the agents' own client
  (:class:`~envrl.agents.openai_backend.OpenAIBackend`, which retries what another attempt
  can fix); a request that still fails, or a reply that is empty or holds the response
  format's tags, drops that row (counted).
* ``hf:PATH``: a local transformers model through :class:`~envrl.agents.hf.HFBackend`
  (greedy decoding), with the same dropping rule.

Both the contrast pattern and the model writers' prompt are a template (data):
``envrl/training/templates/rationale.json`` by default, or any JSON file with the same keys.
``envrl data rationales --data DIR --writer W`` runs a writer over ``DIR/rollout.parquet`` and
saves ``DIR/rationales.parquet`` (rows ``episode``, ``step``, ``alternative``, ``writer``,
``rationale``; a dropped row is absent), written to a temporary file and renamed, so a folder
never holds half a file.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from envrl.agents.generation import Backend, Message, SamplingConfig
from envrl.training.templates import load_template

RATIONALES_FILE = "rationales.parquet"
#: the key of a rollout row (and of its rationale)
ROW_KEY = ("episode", "step", "alternative")
DEFAULT_RATIONALE_TEMPLATE = "rationale"

_TEMPLATE_KEYS = ("name", "system", "user", "contrast", "contrast_outcome_chars", "prompt_outcome_chars")
_TEMPLATE_FIELDS = (
    "instruction",
    "observation",
    "expert_action",
    "expert_outcome",
    "alternative_action",
    "alternative_outcome",
)
#: a rationale holding one of these tags would break the response it is put in
_FORMAT_TAG = re.compile(r"</?\s*(think|action)\s*>", re.IGNORECASE)


class RationaleError(ValueError):
    """A writer or a rationale file that cannot be used; the message says what to do."""


@dataclass(frozen=True)
class RationaleTemplate:
    """The contrast pattern and the model writers' prompt (see the module docstring)."""

    name: str
    system: str
    user: str
    contrast: str
    contrast_outcome_chars: int
    prompt_outcome_chars: int
    description: str = ""
    source: str = field(default="", compare=False)

    def contrast_text(self, row: Mapping[str, Any]) -> str:
        """The contrast writer's rationale for a rollout row."""
        return self.contrast.format(**_fields(row, self.contrast_outcome_chars))

    def messages(self, row: Mapping[str, Any]) -> list[Message]:
        """A model writer's prompt for a rollout row."""
        user = self.user.format(**_fields(row, self.prompt_outcome_chars))
        return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]


def _fields(row: Mapping[str, Any], outcome_chars: int) -> dict[str, str]:
    return {
        "instruction": str(row["instruction"]),
        "observation": cut(str(row["observation"]), outcome_chars),
        "expert_action": str(row["expert_action"]),
        "expert_outcome": cut(str(row["expert_next_observation"]), outcome_chars),
        "alternative_action": str(row["action"]),
        "alternative_outcome": cut(str(row["next_observation"]), outcome_chars),
    }


def cut(text: str, limit: int) -> str:
    """``text`` on one line (whitespace runs made one space), its first ``limit`` characters,
    ``...`` appended when it was longer."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit].rstrip() + "..."


def load_rationale_template(name_or_path: str | Path = DEFAULT_RATIONALE_TEMPLATE) -> RationaleTemplate:
    """The built-in ``rationale`` template, or a JSON file with its keys."""
    builtins = {DEFAULT_RATIONALE_TEMPLATE: "rationale.json"}
    data, source = load_template(name_or_path, builtins=builtins, label="rationale template", error=RationaleError)
    missing = [key for key in _TEMPLATE_KEYS if key not in data]
    unknown = sorted(set(data) - {*_TEMPLATE_KEYS, "description"})
    if missing or unknown:
        problem = f"lacks {', '.join(missing)}" if missing else f"has unknown keys {', '.join(unknown)}"
        raise RationaleError(f"rationale template {source} {problem}")
    template = RationaleTemplate(**{k: data[k] for k in (*_TEMPLATE_KEYS, "description") if k in data}, source=source)
    dummy = dict.fromkeys(_TEMPLATE_FIELDS, "")
    for key in ("user", "contrast"):
        try:
            getattr(template, key).format(**dummy)
        except (KeyError, IndexError, ValueError) as exc:
            raise RationaleError(
                f"rationale template {source}: {key} uses an unknown or malformed field ({exc})"
            ) from exc
    return template


# ---- writers ---------------------------------------------------------------------------------


class RationaleWriter(Protocol):
    """Writes one rationale per rollout row, or None for a row it dropped."""

    #: the spec the rationales are saved under (SR uses a file only when its writer matches)
    spec: str

    def write(self, rows: Sequence[Mapping[str, Any]]) -> list[str | None]: ...

    def close(self) -> None: ...


class ContrastWriter:
    """The offline writer: :meth:`RationaleTemplate.contrast_text` of each row (see the module docstring)."""

    spec = "contrast"

    def __init__(self, template: RationaleTemplate) -> None:
        self.template = template

    def write(self, rows: Sequence[Mapping[str, Any]]) -> list[str | None]:
        return [self.template.contrast_text(row) for row in rows]

    def close(self) -> None:
        pass


class ModelWriter:
    """A writer over a generation back end (an ``openai:`` server or an ``hf:`` model), greedy;
    ``dropped`` counts the rows whose request failed or whose reply is unusable."""

    def __init__(self, spec: str, backend: Backend, template: RationaleTemplate, max_new_tokens: int = 128) -> None:
        self.spec = spec
        self.backend = backend
        self.template = template
        self.sampling = SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens)
        self.dropped = 0

    def write(self, rows: Sequence[Mapping[str, Any]]) -> list[str | None]:
        generations = self.backend.generate([self.template.messages(row) for row in rows], self.sampling)
        out = [None if g.error is not None else clean_rationale(g.text) for g in generations]
        self.dropped += sum(1 for text in out if text is None)
        return out

    def close(self) -> None:
        self.backend.close()


def clean_rationale(text: str) -> str | None:
    """A model's reply as a rationale: on one line; None when empty or holding ``<think>``/``<action>``
    tags (which would break the response it goes into)."""
    flat = " ".join(str(text).split())
    return None if not flat or _FORMAT_TAG.search(flat) else flat


def make_writer(
    spec: str,
    *,
    template: str | Path = DEFAULT_RATIONALE_TEMPLATE,
    max_new_tokens: int = 128,
    device: str = "auto",
) -> RationaleWriter:
    """The writer ``spec`` names: ``contrast``, ``openai:MODEL[@BASE_URL]`` or ``hf:PATH``."""
    check_writer_spec(spec)
    loaded = load_rationale_template(template)
    if spec == "contrast":
        return ContrastWriter(loaded)
    kind, _, target = spec.partition(":")
    if kind == "openai":
        from envrl.agents.openai_backend import OpenAIBackend, parse_openai_spec

        model, base_url = parse_openai_spec(target)
        return ModelWriter(spec, OpenAIBackend(model, base_url), loaded, max_new_tokens)
    from envrl.agents.hf import HFBackend

    if target.startswith(("/", "./", "../", "~")) and not Path(target).expanduser().exists():
        raise RationaleError(f"no checkpoint at {target}")
    return ModelWriter(spec, HFBackend(target, device=device), loaded, max_new_tokens)


def check_writer_spec(spec: str) -> None:
    """RationaleError unless ``spec`` has a writer's form (nothing is loaded)."""
    kind, _, target = spec.partition(":")
    if spec != "contrast" and not (kind in ("openai", "hf") and target):
        raise RationaleError(f"unknown rationale writer {spec!r}; use contrast, openai:MODEL[@BASE_URL] or hf:PATH")


# ---- files -----------------------------------------------------------------------------------


def write_rationales(
    folder: str | Path,
    writer: str | RationaleWriter,
    *,
    out_name: str = RATIONALES_FILE,
    batch_size: int = 32,
    progress: bool = False,
) -> Path:
    """Run ``writer`` (a spec or a writer) over ``folder/rollout.parquet`` and save the rationales
    to ``folder/out_name`` atomically (see the module docstring); returns the file's path."""
    from envrl.training.early_experience_data import read_early_experience

    if batch_size < 1:
        raise RationaleError(f"batch_size must be at least 1, got {batch_size}")
    data = read_early_experience(folder, "rationales")
    made = make_writer(writer) if isinstance(writer, str) else writer
    rows: list[dict[str, Any]] = []
    try:
        for start in _progress(range(0, len(data.rollout), batch_size), progress):
            chunk = data.rollout[start : start + batch_size]
            for row, text in zip(chunk, made.write(chunk)):
                if text is not None:
                    rows.append({**{k: int(row[k]) for k in ROW_KEY}, "writer": made.spec, "rationale": text})
    finally:
        if isinstance(writer, str):
            made.close()
    return _save(rows, data.folder / out_name)


def _save(rows: list[dict[str, Any]], path: Path) -> Path:
    from datasets import Dataset, Features, Value

    schema = Features({**{k: Value("int64") for k in ROW_KEY}, "writer": Value("string"), "rationale": Value("string")})
    dataset = Dataset.from_dict({name: [row[name] for row in rows] for name in schema}, features=schema)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        dataset.to_parquet(str(temporary))
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path


def saved_writer(folder: str | Path, name: str = RATIONALES_FILE) -> str | None:
    """The writer of ``folder/name``, None when there is no such file (RationaleError when it mixes writers)."""
    import pyarrow.parquet as pq

    path = Path(folder) / name
    if not path.is_file():
        return None
    writers = set(pq.read_table(path, columns=["writer"]).column("writer").to_pylist())
    if len(writers) > 1:
        raise RationaleError(f"{path} mixes writers ({', '.join(sorted(writers))}); write it again with one")
    return writers.pop() if writers else None


def check_rationales(folder: str | Path, spec: str) -> bool:
    """Whether ``folder`` holds rationales by the writer ``spec``; RationaleError (naming the command
    that writes them) when it does not and ``spec`` is a model writer, which SR cannot run itself."""
    check_writer_spec(spec)
    saved = saved_writer(folder) == spec
    if not saved and spec != "contrast":
        raise RationaleError(
            f"{folder} has no rationales written by {spec}; write them first with "
            f"`envrl data rationales --data {folder} --writer {spec}`"
        )
    return saved


def rationales_for(folder: str | Path, spec: str, rows: Sequence[Mapping[str, Any]]) -> dict[tuple[int, ...], str]:
    """The rationale of each rollout row by :data:`ROW_KEY`, for SR: the saved file's when its
    writer is ``spec``, else the contrast writer's made now; another writer without a saved
    file is refused, naming the command that writes one."""
    import pyarrow.parquet as pq

    if check_rationales(folder, spec):
        saved = pq.read_table(Path(folder) / RATIONALES_FILE).to_pylist()
        return {tuple(int(r[k]) for k in ROW_KEY): str(r["rationale"]) for r in saved}
    writer = make_writer(spec)
    return {tuple(int(r[k]) for k in ROW_KEY): str(text) for r, text in zip(rows, writer.write(rows))}


def _progress(items: range, enabled: bool) -> Any:
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc="rationales", unit="batch", file=sys.stderr)


# ---- command line ----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``envrl data rationales``."""
    parser.add_argument("--data", required=True, help="an early-experience folder (expert.parquet, rollout.parquet)")
    parser.add_argument("--writer", default="contrast", help="contrast (default), openai:MODEL[@BASE_URL] or hf:PATH")
    parser.add_argument(
        "--template", default=DEFAULT_RATIONALE_TEMPLATE, help="rationale template: 'rationale' or a JSON file"
    )
    parser.add_argument("--max-new-tokens", type=int, default=128, help="model writers: tokens per rationale")
    parser.add_argument("--batch-size", type=int, default=32, help="rows sent to the writer at once (default 32)")
    parser.add_argument("--device", default="auto", help="hf: writers: cpu, cuda or auto (default auto)")
    parser.add_argument("--out-name", default=RATIONALES_FILE, help=f"file name in --data (default {RATIONALES_FILE})")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """``envrl data rationales``: write them, then say how many were kept. 0 when some were
    written, 1 when every row was dropped, 2 on bad input."""
    prog = "envrl data rationales"
    try:
        writer = make_writer(
            args.writer, template=args.template, max_new_tokens=args.max_new_tokens, device=args.device
        )
    except (ValueError, ImportError, OSError) as exc:
        print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    try:
        path = write_rationales(
            args.data, writer, out_name=args.out_name, batch_size=args.batch_size, progress=not args.no_progress
        )
    except ValueError as exc:  # ConfigError and RationaleError too
        print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    finally:
        writer.close()
    import pyarrow.parquet as pq

    written = pq.read_metadata(path).num_rows
    dropped = getattr(writer, "dropped", 0)
    print(f"wrote {written} rationales by {writer.spec} to {path} ({dropped} rows dropped: failed or unusable replies)")
    if not written and dropped:
        print(f"{prog}: error: every row was dropped", file=sys.stderr)
        return 1
    return 0
