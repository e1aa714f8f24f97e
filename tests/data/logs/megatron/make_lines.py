"""Writes the stdout of Megatron-LM's own training-loop logging (megatron/training/training.py
training_log, evaluate, evaluate_and_print_results at commit d98e8a6, with the helpers they call)
for a short run: 8 iterations logged every 2 (and the first), validation every 4, then the
end-of-training validation and test sets.

usage: make_lines.py extract MEGATRON_GIT_DIR   rewrites upstream/ from the commit's files
       make_lines.py > training_log.log          runs upstream/'s code (torch on CPU, gloo)

upstream/ holds, per Megatron file, the top-level statements this run executes, copied unchanged
by `extract` (ast source segments, in file order, with the file's stdlib and torch imports).
Only what cannot run here is stubbed, each named below: the GPU (CUDA tensors, synchronize, memory
counters), the clock, the model's forward pass, and Megatron's process-wide state (args,
microbatch calculator, parallel groups) that pretrain() would have set up."""

import ast
import contextlib
import datetime as _datetime
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from unittest import mock

COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
HERE = Path(__file__).resolve().parent
UPSTREAM = HERE / "upstream"

# Megatron file -> the top-level names (defs, classes, assignments; "logging.basicConfig" is the
# call at the top of training.py that routes logging to stdout) its upstream/ copy keeps.
EXTRACT = {
    "megatron/core/_rank_utils.py": ["safe_get_rank"],
    "megatron/core/telemetry/fallbacks.py": ["trace_fn", "managed_span"],
    "megatron/core/models/gpt/experimental_attention_variant_module_specs.py": [
        "GDN_ATTENTION_VARIANTS",
        "_DEPRECATED_ATTENTION_VARIANT_ALIASES",
        "is_gated_delta_net_variant",
        "is_linear_attention_variant",
    ],
    "megatron/core/timers.py": ["logger", "TimerBase", "DummyTimer", "Timer", "Timers"],
    "megatron/training/log_handler.py": ["BLACKLISTED_MODULES", "CustomHandler"],
    "megatron/training/ft_integration.py": [
        "_GLOBAL_RANK_MONITOR_CLIENT",
        "_is_setup_section_open",
        "_curr_eval_iter_idx",
        "_NUM_WARMUP_ITERS",
        "get_rank_monitor_client",
        "on_eval_step_start",
        "on_eval_step_end",
    ],
    "megatron/training/one_logger_utils.py": ["track_e2e_metrics", "track_app_tag"],
    "megatron/training/utils/common_utils.py": [
        "reduce_max_stat_across_model_parallel_group",
        "report_memory",
        "print_rank_0",
        "is_last_rank",
        "print_rank_last",
        "is_hybrid_model",
    ],
    "megatron/training/theoretical_memory_usage.py": [
        "NUM_BYTES_IN_MEGABYTE",
        "compute_weight_and_optimizer_memory",
        "compute_activation_memory",
        "compute_activation_memory_without_sp",
        "report_theoretical_memory",
    ],
    "megatron/training/training.py": [
        "logging.basicConfig",
        "print_datetime",
        "num_floating_point_operations",
        "training_log",
        "evaluate",
        "evaluate_and_print_results",
    ],
}


def _top_level(body):
    """Top-level statements, those inside a top-level try's branches included."""
    for node in body:
        if isinstance(node, ast.Try):
            yield from _top_level(node.body)
            for handler in node.handlers:
                yield from _top_level(handler.body)
        else:
            yield node


def _name(node):
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        return getattr(target, "id", None)
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        return ast.unparse(node.value.func)


def _kept_import(node, also=("torch",)):
    if isinstance(node, ast.Import):
        roots = {a.name.split(".")[0] for a in node.names}
    elif isinstance(node, ast.ImportFrom) and not node.level:
        roots = {node.module.split(".")[0]}
    else:
        return False
    return roots <= set(sys.stdlib_module_names) | set(also)


def extract(git_dir):
    for path, names in EXTRACT.items():
        source = subprocess.run(
            ["git", f"--git-dir={git_dir}", "show", f"{COMMIT}:{path}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        lines = source.splitlines()
        tree = ast.parse(source)
        imports = [ast.get_source_segment(source, n) for n in tree.body if _kept_import(n)]
        imports += [  # a try's own imports (the optional ones in the other branch are left out)
            ast.get_source_segment(source, n)
            for n in _top_level(tree.body)
            if n not in tree.body and _kept_import(n, also=())
        ]
        parts, found, nested = ["\n".join(imports)], set(), False
        for node in _top_level(tree.body):
            if _name(node) in names and _name(node) not in found:
                found.add(_name(node))
                first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
                segment = "\n".join(lines[first - 1 : node.end_lineno])
                parts.append(_dedent(segment, node.col_offset))
                nested = nested or node.col_offset > 0
        missing = set(names) - found
        assert not missing, f"{path}: {missing} not found at {COMMIT}"
        header = (
            f"# From NVIDIA/Megatron-LM {path}\n# at commit {COMMIT} (2026-08-22),\n"
            f"# copied unchanged by tests/data/logs/megatron/make_lines.py extract: the file's\n"
            f"# stdlib and torch imports, then:\n# {', '.join(names)}.\n"
            + ("# (Defined in a try's except branch there: dedented here.)\n" if nested else "")
            + f"# The file's notice: {lines[0].lstrip('# ')}\n"
        )
        out = UPSTREAM / path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(header + "\n" + "\n\n\n".join(parts) + "\n")


def _dedent(segment, col):
    return "\n".join(line[col:] for line in segment.splitlines())


# ---- the run ---------------------------------------------------------------------------------

# Llama-3-8B's shape (meta-llama/Meta-Llama-3-8B config.json: hidden 4096, 32 layers, 32 heads,
# 8 KV heads, FFN 14336, vocabulary 128256), sequence 8192, bf16 on 8 GPUs (data parallel 8, micro
# batch 1, global batch 32: 4 microbatches); the flags a Megatron pretraining script passes, with
# --log-interval 2 --eval-interval 4 --eval-iters 2 --train-iters 8 --log-throughput.
ARGS = dict(
    hidden_size=4096,
    num_layers=32,
    num_attention_heads=32,
    num_query_groups=8,
    group_query_attention=True,
    kv_channels=128,
    ffn_hidden_size=14336,
    padded_vocab_size=128256,
    seq_length=8192,
    swiglu=True,
    normalization="RMSNorm",
    add_bias_linear=False,
    world_size=8,
    data_parallel_size=8,
    tensor_model_parallel_size=1,
    pipeline_model_parallel_size=1,
    virtual_pipeline_model_parallel_size=None,
    context_parallel_size=1,
    expert_model_parallel_size=1,
    expert_tensor_parallel_size=1,
    gtp_weight_remat_size=1,
    micro_batch_size=1,
    global_batch_size=32,
    eval_micro_batch_size=1,
    eval_global_batch_size=32,
    train_iters=8,
    log_interval=2,
    eval_interval=4,
    eval_iters=2,
    log_throughput=True,
    use_distributed_optimizer=True,
    sequence_parallel=False,
    untie_embeddings_and_output_weights=True,
    recompute_granularity=None,
    # the remaining defaults of megatron/training/arguments.py that these functions read
    timing_log_level=0,
    timing_log_option="minmax",
    tensorboard_log_interval=1,
    consumed_train_samples=0,
    skipped_train_samples=0,
    consumed_valid_samples=0,
    perform_rl_step=False,
    freeze_all_layers=False,
    num_experts=None,
    mtp_num_layers=None,
    dsa_indexer_loss_coeff=None,
    profile_ranks=[],
    record_memory_history=False,
    log_timers_to_tensorboard=False,
    log_energy=False,
    log_memory_interval=None,
    log_device_memory_used=False,
    rl_profile=False,
    hybrid_layer_pattern=None,
    multi_latent_attention=False,
    experimental_attention_variant=None,
    linear_attention_freq=None,
    moe_layer_freq=1,
    moe_shared_expert_intermediate_size=None,
    moe_latent_size=None,
    attention_output_gate=False,
    multiple_validation_sets=False,
    full_validation=False,
    validation_set_names=None,
    cuda_graph_impl="none",
    moe_expert_rank_capacity_factor=None,
    decoder_seq_length=None,
    empty_unused_memory_level=0,
    sft=False,
    exit_duration_in_mins=None,
    log_validation_ppl_to_tensorboard=False,
    moe_ffn_hidden_size=None,
)
STEP_S = [9.0, 4.5, 4.52, 4.48, 4.6, 4.5, 4.55, 4.45]  # iterations 1-8, on the clock below
LOSS = [11.9, 10.8, 9.7, 8.9, 8.1, 7.6, 7.2, 6.9]  # lm loss of iterations 1-8
EVAL_S, EVAL_LOSS = 1.5, 7.8  # per evaluation iteration; the lm loss of every eval microbatch


class Clock:
    """The clock Timers and the log's timestamps read (not real: advanced by hand)."""

    t = 1787400000.0  # 2026-08-22 12:00:00 UTC

    @classmethod
    def time(cls):
        return cls.t


class ClockDatetime(_datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls.fromtimestamp(Clock.t, tz or _datetime.UTC).replace(tzinfo=tz)


class CudaOnCpu(contextlib.AbstractContextManager):
    """No GPU here: tensors Megatron puts on 'cuda' are made on the CPU, synchronize is a no-op,
    and the memory counters report fixed values (an H100's, made up)."""

    def __enter__(self):
        from torch.overrides import TorchFunctionMode

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = dict(kwargs or {})
                if str(kwargs.get("device", "")).startswith("cuda"):
                    kwargs["device"] = "cpu"
                return func(*args, **kwargs)

        self.stack = contextlib.ExitStack()
        self.stack.enter_context(Mode())
        gib = 1024**3
        for name, value in [
            ("synchronize", lambda *a: None),
            ("current_device", lambda: "cpu"),
            ("memory_allocated", lambda: 31.2 * gib),
            ("max_memory_allocated", lambda: 58.7 * gib),
            ("memory_reserved", lambda: 62.0 * gib),
            ("max_memory_reserved", lambda: 62.0 * gib),
        ]:
            self.stack.enter_context(mock.patch.object(torch.cuda, name, value))
        return self

    def __exit__(self, *exc):
        self.stack.close()


def load(path, **names):
    """Executes upstream/<path> as module megatron.<...>, ``names`` (what its Megatron imports
    give) in scope; returns the module."""
    module = types.ModuleType(path.removesuffix(".py").replace("/", "."))
    module.__dict__.update(names)
    file = UPSTREAM / path
    exec(compile(file.read_text(), str(file), "exec"), module.__dict__)
    return module


def run():
    global torch
    import torch
    import torch.distributed as dist

    store = tempfile.NamedTemporaryFile(delete=False)
    # One process, the job's last rank (print_rank_last prints there); the 8-GPU job is in args.
    dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0, world_size=1)
    args = types.SimpleNamespace(**ARGS)
    # megatron.core.parallel_state, as pretrain() sets it up: this rank is rank 0 of its model-
    # and data-parallel groups; the only group here is the world.
    mpu = types.SimpleNamespace(
        get_model_parallel_group=lambda: dist.group.WORLD,
        get_data_parallel_rank=lambda: 0,
        get_tensor_model_parallel_rank=lambda: 0,
    )
    global_vars = dict(  # megatron/training/global_vars.py: no tensorboard, wandb, one-logger
        get_args=lambda: args,
        get_tensorboard_writer=lambda: None,
        get_wandb_writer=lambda: None,
        get_one_logger=lambda: None,
        get_energy_monitor=lambda: None,
        get_telemetry=lambda: None,
    )
    rank_utils = load("megatron/core/_rank_utils.py")
    fallbacks = load("megatron/core/telemetry/fallbacks.py")
    timers_mod = load("megatron/core/timers.py")
    timers_mod.time = Clock
    timers_mod.dist_all_gather_func = dist.all_gather_into_tensor  # timers.py's, torch >= 1.13
    timers = timers_mod.Timers(args.timing_log_level, args.timing_log_option)
    global_vars["get_timers"] = lambda: timers
    log_handler = load("megatron/training/log_handler.py")
    ft = load("megatron/training/ft_integration.py")
    one_logger_utils = load("megatron/training/one_logger_utils.py", **global_vars)
    common = load(
        "megatron/training/utils/common_utils.py",
        _safe_get_rank=rank_utils.safe_get_rank,
        mpu=mpu,
        **global_vars,
    )
    memory = load(
        "megatron/training/theoretical_memory_usage.py",
        is_hybrid_model=common.is_hybrid_model,
        print_rank_0=common.print_rank_0,
    )

    class Rerun:  # megatron.core.rerun_state_machine: only its mode is saved and restored here
        mode = "enabled"

        def get_mode(self):
            return self.mode

        def set_mode(self, mode):
            self.mode = mode

    pg = types.SimpleNamespace(pp=None, dp_cp=dist.group.WORLD, dp=dist.group.WORLD)

    def forward_backward(num_microbatches, micro_batch_size, seq_length, forward_only, **_):
        """The model (not run): per microbatch, the {'lm loss': [loss sum, tokens]} GPT's
        loss_func reports (pretrain_gpt.py), after EVAL_S on the clock."""
        assert forward_only
        Clock.t += EVAL_S
        tokens = micro_batch_size * seq_length
        loss = torch.tensor([EVAL_LOSS * tokens, float(tokens)])
        return [{"lm loss": loss.clone()} for _ in range(num_microbatches)]

    variants = load("megatron/core/models/gpt/experimental_attention_variant_module_specs.py")
    training = load(
        "megatron/training/training.py",
        is_linear_attention_variant=variants.is_linear_attention_variant,
        CustomHandler=log_handler.CustomHandler,
        **global_vars,
        **{k: getattr(common, k) for k in EXTRACT["megatron/training/utils/common_utils.py"]},
        report_theoretical_memory=memory.report_theoretical_memory,
        safe_get_rank=rank_utils.safe_get_rank,
        ft_integration=ft,
        one_logger_utils=one_logger_utils,
        _otel_trace_fn=fallbacks.trace_fn,
        _otel_managed_span=fallbacks.managed_span,
        mpu=mpu,
        # training.py's optional imports, absent here as in a plain Megatron install
        has_rl_utils=False,
        has_nvidia_modelopt=False,
        # megatron.core.num_microbatches_calculator with a constant global batch
        get_num_microbatches=lambda: (
            args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)
        ),
        get_loaded_iteration=lambda: None,  # no checkpoint loaded
        get_rerun_state_machine=Rerun,
        RerunMode=types.SimpleNamespace(DISABLED="disabled"),
        get_forward_backward_func=lambda **_: forward_backward,
        get_attr_wrapped_model=lambda model, attr: pg,  # the model's process groups
        is_pp_last_stage=lambda group: True,  # one pipeline stage
    )
    training.datetime = ClockDatetime
    training.time = Clock

    model = [torch.nn.Module()]
    config = types.SimpleNamespace(timers=timers)
    eval_kwargs = dict(
        forward_step_func=None,
        data_iterator=None,
        model=model,
        process_non_loss_data_func=None,
        config=config,
    )
    with CudaOnCpu():
        # train() (training.py): the interval timer, the loop's training_log call and its
        # evaluation at the eval interval; then pretrain()'s validation and test sets.
        timers("interval-time", log_level=0).start(barrier=True)
        training.print_datetime("before the start of training step")
        report_memory_flag, total_loss_dict = True, {}
        for iteration, (secs, loss) in enumerate(zip(STEP_S, LOSS), start=1):
            Clock.t += secs  # train_step
            args.consumed_train_samples += args.global_batch_size
            args.curr_iteration = iteration
            report_memory_flag = training.training_log(
                {"lm loss": torch.tensor(loss)},
                total_loss_dict,
                3.0e-4 * iteration / args.train_iters,
                iteration,
                1.0,
                report_memory_flag,
                0,
                1.5 - 0.1 * iteration,
                None,
                None,
                None,
                pg_collection=None,
                is_first_iteration=iteration == 1,
            )
            if iteration % args.eval_interval == 0:
                timers("interval-time").stop()
                timers("eval-time", log_level=0).start(barrier=True)
                training.evaluate_and_print_results(
                    f"iteration {iteration}", iteration=iteration, verbose=False, **eval_kwargs
                )
                timers("eval-time").stop()
                timers("interval-time", log_level=0).start(barrier=True)
        training.print_datetime("after training is done")
        for which in ("validation", "test"):
            training.evaluate_and_print_results(
                f"iteration {iteration} on {which} set",
                iteration=iteration,
                verbose=True,
                write_to_tensorboard=False,
                **eval_kwargs,
            )
    dist.destroy_process_group()
    os.unlink(store.name)


if __name__ == "__main__":
    if sys.argv[1:2] == ["extract"]:
        extract(sys.argv[2])
    else:
        run()
