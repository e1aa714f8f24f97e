"""What one training job is: ``TrainConfig``, built from a run spec, checked before launch.

Kept free of torch imports so the orchestrator (``wattflex.runs.real_run``) can validate a
spec and fail fast — missing model or data — before it touches a GPU's power limit. The
names of the files a training job leaves live here too, so the orchestrator and a user's own
command (``wattflex.runs.command_run``) read and write them without importing torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from wattflex.architectures import ARCHITECTURES
from wattflex.provenance import strict_json
from wattflex.runs.attention import catalog_attn_implementation
from wattflex.schema import section_defaults
from wattflex.vocabulary import TASKS

STEPS_FILE = "steps.parquet"
RESULT_FILE = ".training.json"  # merged into run.json by wattflex.runs.real_run, then removed
# Read while training runs by the one-run sweep (wattflex.runs.sweep.real); removed by real_run.
LIVE_STEPS_FILE = "steps.live.csv"  # rank 0 appends "step,t_end_s,tokens,loss" as each step ends
STOP_FILE = ".stop"  # created by the orchestrator: stop after the current step
PRECISIONS = ("bf16-mixed", "bf16", "fp32")
PARALLEL = ("auto", "ddp", "fsdp")


# The schema's defaults (config/schema/config.schema.yaml): TrainConfig() is the job from_spec({}) describes.
_TOP, _GROUP = section_defaults(), section_defaults("group_defaults")
_RUN, _CUDA = section_defaults("run"), section_defaults("cuda")


@dataclass
class TrainConfig:
    """One training job. Times are seconds since the training loop started. Defaults: the
    schema's (a group's, ``run:``'s, ``cuda:``'s and the campaign's ``seed``)."""

    model_facts: dict[str, Any]
    task: str = "pt"  # pt (full AdamW) | lora (LoRA SFT)
    seq_len: int = _GROUP["seq_len"]
    batch: int = _GROUP["batch"]  # micro-batch per GPU (sequences)
    lora_rank: int = _GROUP["lora_rank"]
    ep: int = _GROUP["ep"]  # expert-parallel degree (MoE pretraining; see training.parallel)
    compile: bool = _GROUP["compile"]
    grad_checkpointing: bool = _GROUP["grad_checkpointing"]
    loss_chunk_tokens: int = _CUDA[
        "loss_chunk_tokens"
    ]  # chunked loss (training.loss): tokens per lm_head chunk; 0 = off
    device: str = _CUDA["device"]  # cuda | cpu
    model_path: str | None = None  # local HF model dir (or hub cache id with HF_HOME set)
    data_path: str | None = None  # parquet/arrow shards of token ids; None = synthetic
    tiny: bool = _CUDA["tiny"]  # random-init tiny model from model_facts' family
    random_init: bool = _CUDA["random_init"]  # full-size model from model_facts with random weights
    seed: int = _TOP["seed"]
    duration_s: float = float(_RUN["duration_s"])
    max_steps: int | None = None
    eval_at_s: float | None = _RUN["eval_at_s"]  # None: no eval event
    eval_batches: int = _CUDA["eval_batches"]
    checkpoint_at_s: float | None = _RUN["checkpoint_at_s"]  # None: no checkpoint event
    checkpoint_dir: str | None = (
        None  # default <outdir>/checkpoint; $VARS and {run} (training.checkpoint)
    )
    checkpoint_async: bool = _CUDA[
        "checkpoint_async"
    ]  # DCP async_save: training resumes once the state is copied
    dist_timeout_s: float = float(
        _CUDA["dist_timeout_s"]
    )  # process-group timeout: a 70B load outlasts torch's 10 min
    cpu_binding: bool = _CUDA[
        "cpu_binding"
    ]  # each local rank on its own share of the task's CPUs (training.cpus)
    keep_checkpoint: bool = _CUDA[
        "keep_checkpoint"
    ]  # the paper's checkpoint is an I/O event, not an artifact
    resume: bool = False  # start from the newest complete checkpoint (a requeued job)
    lr: float | None = None  # default: 3e-4 (pt), 2e-4 (lora)
    precision: str | None = None  # default: bf16-mixed on cuda, fp32 on cpu
    parallel: str = _CUDA["parallel"]  # auto: FSDP2 on multi-GPU cuda, DDP on cpu
    attn_implementation: str | None = None  # None: transformers' default for the family
    outdir: str = "."

    @property
    def hf_model_type(self) -> str:
        """The Hugging Face ``model_type`` of the model (``llama``, ``qwen3_moe``...), "" if the
        catalogue gives none.
        """
        return str(self.model_facts.get("hf_model_type", ""))

    @property
    def architecture(self) -> str:
        """The model's architecture (``dense``, ``moe``...): the one ``wattflex.architectures`` gives
        its ``model_type``, else the catalogue's, else ``dense``.
        """
        return ARCHITECTURES.get(
            self.hf_model_type, str(self.model_facts.get("architecture", "dense"))
        )

    @property
    def learning_rate(self) -> float:
        """The optimizer's learning rate: ``lr`` if set, else 3e-4 for pre-training and 2e-4 for LoRA
        (the defaults noted on ``lr``).
        """
        return self.lr if self.lr is not None else (3e-4 if self.task == "pt" else 2e-4)

    @property
    def dtype_policy(self) -> str:
        """The dtype policy for this precision on this device (``bf16-mixed``, ``fp32``...; see
        ``runs.training.parallel.dtype_policy``).
        """
        return dtype_policy(self.precision, self.device)

    @classmethod
    def from_spec(cls, spec: dict[str, Any], outdir: str | Path) -> TrainConfig:
        """The training part of a ``run_at_cap`` spec (see ``wattflex.runs.real_run``)."""
        group, run, cuda = spec.get("group", {}), spec.get("run", {}), spec.get("cuda", {})
        return cls(
            model_facts=dict(spec.get("model_facts") or {}),
            task=str(group.get("task", "pt")),
            seq_len=int(group.get("seq_len", _GROUP["seq_len"])),
            batch=int(group.get("batch", _GROUP["batch"])),
            lora_rank=int(group.get("lora_rank", _GROUP["lora_rank"])),
            ep=int(group.get("ep", _GROUP["ep"])),
            # a spec from wattflex.config.run_spec has both; one without takes the schema's group default
            compile=bool(group.get("compile", _GROUP["compile"])),
            grad_checkpointing=bool(group.get("grad_checkpointing", _GROUP["grad_checkpointing"])),
            loss_chunk_tokens=int(cuda.get("loss_chunk_tokens", _CUDA["loss_chunk_tokens"])),
            device=str(cuda.get("device", _CUDA["device"])),
            model_path=cuda.get("model_path"),
            data_path=cuda.get("data_path"),
            tiny=bool(cuda.get("tiny", _CUDA["tiny"])),
            random_init=bool(cuda.get("random_init", _CUDA["random_init"])),
            seed=int(spec.get("seed", _TOP["seed"])),
            duration_s=float(run.get("duration_s", _RUN["duration_s"])),
            max_steps=_opt_int(cuda.get("max_steps")),
            eval_at_s=_opt_float(run.get("eval_at_s")),
            eval_batches=int(cuda.get("eval_batches", _CUDA["eval_batches"])),
            checkpoint_at_s=_opt_float(run.get("checkpoint_at_s")),
            checkpoint_dir=cuda.get("checkpoint_dir"),
            keep_checkpoint=bool(cuda.get("keep_checkpoint", _CUDA["keep_checkpoint"])),
            checkpoint_async=bool(cuda.get("checkpoint_async", _CUDA["checkpoint_async"])),
            dist_timeout_s=float(cuda.get("dist_timeout_s", _CUDA["dist_timeout_s"])),
            cpu_binding=bool(cuda.get("cpu_binding", _CUDA["cpu_binding"])),
            lr=_opt_float(cuda.get("lr")),
            precision=precision_choice(group, cuda),
            parallel=str(cuda.get("parallel", _CUDA["parallel"])),
            # The catalog's choice for the task unless the cuda section overrides it, so the
            # harness runs the attention the emulator models (wattflex.runs.attention).
            attn_implementation=(
                cuda.get("attn_implementation")
                or catalog_attn_implementation(
                    spec.get("model_facts") or {}, str(group.get("task", "pt"))
                )
            ),
            outdir=str(outdir),
        )

    def validate(self) -> None:
        """Fail fast, before any GPU is touched, with a message that says what to fix."""
        if self.task not in TASKS:
            raise ValueError(f"task {self.task!r}: expected one of {', '.join(TASKS)}")
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"cuda.device {self.device!r}: expected 'cuda' or 'cpu'")
        if self.dtype_policy not in PRECISIONS:
            raise ValueError(
                f"cuda.precision {self.precision!r}: expected one of {', '.join(PRECISIONS)}"
            )
        if self.parallel not in PARALLEL:
            raise ValueError(
                f"cuda.parallel {self.parallel!r}: expected one of {', '.join(PARALLEL)}"
            )
        if self.loss_chunk_tokens < 0:
            raise ValueError(
                f"cuda.loss_chunk_tokens {self.loss_chunk_tokens}: expected tokens per chunk >= 1, or 0 (no chunking)"
            )
        if self.ep < 1:
            raise ValueError(f"ep {self.ep}: must be >= 1")
        if self.ep > 1 and self.architecture == "moe" and self.task != "pt":
            raise ValueError(
                f"ep {self.ep} with task {self.task!r}: expert parallelism is for pretraining; "
                f"LoRA's adapters on the fused expert weights are not combined with expert sharding "
                f"(use ep 1: experts are then FSDP-sharded like every other weight)"
            )
        if self.ep > 1 and self.architecture == "moe" and self.parallel == "ddp":
            raise ValueError(
                f"ep {self.ep} with cuda.parallel 'ddp': expert parallelism shards the dense "
                f"weights with FSDP; use cuda.parallel 'fsdp' or 'auto'"
            )
        if self.seq_len < 2 or self.batch < 1:
            raise ValueError(
                f"seq_len {self.seq_len} / batch {self.batch}: need seq_len >= 2 and batch >= 1"
            )
        from_config = self.tiny or (self.random_init and self.model_path is None)
        if from_config:
            if self.hf_model_type not in ARCHITECTURES:
                raise ValueError(
                    f"model_facts.hf_model_type {self.hf_model_type!r} cannot be built from config; "
                    f"supported: {', '.join(sorted(ARCHITECTURES))} (or give cuda.model_path)"
                )
        if not from_config and self.model_path is None:
            raise FileNotFoundError(
                f"no model weights: set cuda.model_path to a local model directory for "
                f"{self.model_facts.get('hf_model_type', 'this model')} (runs are offline), "
                f"cuda.random_init: true for the full-size architecture with random weights, "
                f"or cuda.tiny: true for a tiny smoke model"
            )
        if self.model_path is not None:
            p = Path(self.model_path)
            if not p.is_dir() or not (p / "config.json").is_file():
                raise FileNotFoundError(
                    f"cuda.model_path {self.model_path}: not a model directory with config.json "
                    f"(download it beforehand; runs never reach the network)"
                )
        if self.data_path is not None and not Path(self.data_path).exists():
            raise FileNotFoundError(
                f"cuda.data_path {self.data_path}: no such file or directory "
                f"(pre-tokenised parquet/arrow shards of token ids; omit for synthetic tokens)"
            )
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"run.duration_s {self.duration_s}: must be > 0")
        if not (math.isfinite(self.dist_timeout_s) and self.dist_timeout_s > 0):
            raise ValueError(
                f"cuda.dist_timeout_s {self.dist_timeout_s}: must be > 0 seconds "
                f"(default 1800: loading a large model can take tens of minutes)"
            )

    def to_json(self, path: str | Path) -> None:
        """Write the config as strict JSON (no NaN) to ``path``, indented, for the ranks to read."""
        Path(path).write_text(strict_json(asdict(self), indent=2) + "\n")

    @classmethod
    def from_json(cls, path: str | Path) -> TrainConfig:
        """The config written by :meth:`to_json` at ``path``.

        Raises TypeError for a key the config does not have (a file from another version).
        """
        return cls(**json.loads(Path(path).read_text()))


def precision_choice(group: Mapping[str, Any], cuda: Mapping[str, Any]) -> str | None:
    """The precision layout chosen for a group's job: the group's own (the one its plan fits
    with: wattflex.runs.plan) over the campaign's ``cuda.precision``; None: the device's."""
    return group.get("precision") or cuda.get("precision")


def dtype_policy(precision: str | None, device: str) -> str:
    """The layout a job trains in: the chosen one, else bf16-mixed on cuda and fp32 on cpu.
    The harness (``TrainConfig.dtype_policy``) and the plan both read it."""
    return precision or ("bf16-mixed" if device == "cuda" else "fp32")


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)
