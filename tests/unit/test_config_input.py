"""Bad campaign configs stop at validation with one line naming the key: unknown
keys at every level, the ``cuda:`` section and what a ``backend: cuda`` campaign needs, GPU
models; every shipped config still validates; the merge onto config/config.yaml is said."""

import copy
import json
from pathlib import Path

import pytest
import yaml
from snakemake.utils import update_config

from wattflex.config import ConfigError, check_semantics, defaulted_sections, prepare
from wattflex.runs.campaign_checks import check_inputs

REPO = Path(__file__).resolve().parents[2]
DEFAULT = REPO / "config" / "config.yaml"
TINY = REPO / "tests" / "data" / "tiny.yaml"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def merged(*docs: dict) -> dict:
    """As Snakemake builds config: config/config.yaml, then each --configfile merged onto it."""
    cfg = load(DEFAULT)
    for d in docs:
        update_config(cfg, copy.deepcopy(d))
    return cfg


def tiny_cuda(**cuda) -> dict:
    cfg = merged(load(TINY))
    cfg.update(backend="cuda", cuda=cuda)
    return cfg


def model_dir(tmp_path: Path, **facts) -> Path:
    d = tmp_path / "model"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(facts))
    return d


def one_group(cfg: dict, model="Mistral-Small-24B-Base-2501") -> dict:
    cfg["groups"] = [g for g in cfg["groups"] if g["model"] == model][:1]
    cfg["repeats"] = []
    return cfg


# (name, config maker (tmp_path -> cfg), key the message names, words in it)
BROKEN = [
    (
        "unknown top-level key",
        lambda t: {**merged(), "sumary": {"aggregate": "mean"}},
        "(top level)",
        "unknown key 'sumary' (did you mean 'summary'?)",
    ),
    (
        "unknown key in summary",
        lambda t: merged({"summary": {"agregate": "mean"}}),
        "summary",
        "unknown key 'agregate' (did you mean 'aggregate'?)",
    ),
    (
        "unknown key in allocation",
        lambda t: merged({"allocation": {"n_workload": 5}}),
        "allocation",
        "unknown key 'n_workload'",
    ),
    (
        "unknown key in allocation.sla",
        lambda t: merged({"allocation": {"sla": {"tier": [0.1]}}}),
        "allocation.sla",
        "unknown key 'tier'",
    ),
    (
        "unknown key in group_defaults",
        lambda t: merged({"group_defaults": {"colour": "red"}}),
        "group_defaults",
        "unknown key 'colour'",
    ),
    (
        "unknown key in cuda",
        lambda t: tiny_cuda(tiny=True, sampler_period=5),
        "cuda",
        "unknown key 'sampler_period' (did you mean 'sampler_period_s'?)",
    ),
    (
        "misspelled cuda key",
        lambda t: tiny_cuda(modle_path="/models/mistral"),
        "cuda",
        "unknown key 'modle_path' (did you mean 'model_path'?)",
    ),
    (
        "cuda.cap_control not a mode",
        lambda t: tiny_cuda(tiny=True, cap_control="sudo"),
        "cuda.cap_control",
        "is not one of",
    ),
    (
        "cuda.precision not a policy",
        lambda t: tiny_cuda(tiny=True, precision="fp8"),
        "cuda.precision",
        "is not one of",
    ),
    (
        "cuda.tiny a string",
        lambda t: tiny_cuda(tiny="yes"),
        "cuda.tiny",
        "is not of type 'boolean'",
    ),
    (
        "cuda.nnodes zero",
        lambda t: tiny_cuda(tiny=True, nnodes=0),
        "cuda.nnodes",
        "less than the minimum",
    ),
    (
        "backend cuda without a cuda section",
        lambda t: merged({"backend": "cuda"}),
        "cuda.model_path",
        "no model weights for",
    ),
    (
        "backend cuda, cuda section without weights",
        lambda t: tiny_cuda(cap_control="observe"),
        "cuda.model_path",
        "set cuda.model_path to a local model directory",
    ),
    (
        "model_path not there",
        lambda t: tiny_cuda(model_path=str(t / "nope")),
        "cuda.model_path",
        "not a model directory with a readable config.json",
    ),
    (
        "model_path not a model dir (tiny too)",
        lambda t: tiny_cuda(tiny=True, model_path=str(t)),
        "cuda.model_path",
        "not a model directory",
    ),
    (
        "model_path: one model for groups of three",
        lambda t: tiny_cuda(
            model_path=str(
                model_dir(t, model_type="mistral", num_hidden_layers=40, hidden_size=5120)
            )
        ),
        "cuda.model_path",
        "is not gpt-oss-20b",
    ),
    (
        "model_path: same family, other size",
        lambda t: {
            **one_group(
                tiny_cuda(
                    model_path=str(
                        model_dir(t, model_type="mistral", num_hidden_layers=32, hidden_size=4096)
                    )
                )
            )
        },
        "cuda.model_path",
        "num_hidden_layers 32",
    ),
    (
        "data_path not there",
        lambda t: tiny_cuda(tiny=True, data_path=str(t / "shards")),
        "cuda.data_path",
        "no such file or directory",
    ),
    (
        "cap_control command without cap_command",
        lambda t: tiny_cuda(tiny=True, cap_control="command"),
        "cuda.cap_command",
        "cap_control: command needs cap_command",
    ),
    (
        "cap_command without placeholders",
        lambda t: tiny_cuda(tiny=True, cap_control="command", cap_command="sudo setcap"),
        "cuda.cap_command",
        "must contain {gpu} and {watts}",
    ),
    (
        "cap_command with {node}",
        lambda t: tiny_cuda(
            tiny=True, cap_control="command", cap_command="setcap {node} {gpu} {watts}"
        ),
        "cuda.cap_command",
        "has placeholder(s) {node}; only {gpu} and {watts} are filled in",
    ),
    (
        "cap_command with a lone {",
        lambda t: tiny_cuda(tiny=True, cap_control="command", cap_command="setcap { {gpu} {watts}"),
        "cuda.cap_command",
        "is not a valid template",
    ),
    (
        "staircase on cuda with observed caps",
        lambda t: {**tiny_cuda(tiny=True, cap_control="observe"), "sweep": "staircase"},
        "cuda.cap_control",
        "needs cap_control nvml or command",
    ),
    (
        "group gpu H300",
        lambda t: merged(
            {
                "groups": [
                    {"id": "g", "model": "Qwen3-32B", "task": "pt", "gpus": 8, "gpu": "H300"}
                ],
                "repeats": [],
            }
        ),
        "groups[0].gpu",
        "unknown GPU model 'H300'; known: H200, H100, H100-94GB, A100",
    ),
    (
        "group_defaults gpu H300",
        lambda t: merged({"group_defaults": {"gpu": "H300"}}),
        "group_defaults.gpu",
        "unknown GPU model 'H300'; known: H200, H100, H100-94GB, A100",
    ),
    (
        "unknown slurm key",
        lambda t: {**merged(), "slurm_gpus_pernode": 4},
        "(top level)",
        "did you mean 'slurm_gpus_per_node'?",
    ),
]


@pytest.mark.parametrize("name, make, key, words", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_config_is_one_config_error_naming_the_key(tmp_path, name, make, key, words):
    cfg = make(tmp_path)
    with pytest.raises(ConfigError) as err:
        check_inputs(prepare(cfg, base=REPO), cwd=tmp_path)
    msg = str(err.value)
    assert msg.startswith(f"config error at {key}:"), msg
    assert words in msg and "\n" not in msg


def test_an_unknown_gpu_past_the_schema_names_the_known_models():
    """check_semantics looks the GPU up with gpus.gpu_spec: a ConfigError, not a bare KeyError."""
    cfg = prepare(merged(load(TINY)), base=REPO)
    cfg["groups"][0]["gpu"] = "H300"
    with pytest.raises(
        ConfigError, match=r"at groups\[0\]\.gpu: unknown GPU model 'H300'; known: H200, H100"
    ):
        check_semantics(cfg)


@pytest.mark.parametrize(
    "cuda",
    [
        {"tiny": True},  # random-init smoke model: no weights
        {"random_init": True, "cap_control": "observe", "sampler": False, "device": "cpu"},
        {
            "tiny": True,
            "cap_control": "command",
            "cap_command": "sudo /usr/local/bin/setcap {gpu} {watts}",
        },
        {"tiny": True, "cap_control": "nvml", "precision": None, "max_steps": None, "nnodes": None},
        {
            "tiny": True,
            "device": "cpu",  # 2 nodes for an 8-GPU group: a CPU layout (on GPUs: 2 x 4 ranks on 4-GPU nodes)
            "nnodes": 2,
            "nccl": {
                "debug": "INFO",
                "socket_ifname": "ib0",
                "ib_hca": "mlx5_0",
                "env": {"NCCL_NET_GDR_LEVEL": "PHB"},
            },
        },
    ],
    ids=["tiny", "random_init-cpu", "cap-command", "nulls", "two-nodes-nccl"],
)
def test_a_complete_cuda_section_validates(tmp_path, cuda):
    check_inputs(prepare(tiny_cuda(**cuda), base=REPO), cwd=tmp_path)


def test_a_model_directory_of_the_groups_model_validates_relative_to_the_working_directory(
    tmp_path,
):
    model_dir(tmp_path, model_type="mistral", num_hidden_layers=40, hidden_size=5120)
    (tmp_path / "shards").mkdir()
    cfg = one_group(tiny_cuda(model_path="model", data_path="shards"))
    check_inputs(prepare(cfg, base=REPO), cwd=tmp_path)
    with pytest.raises(ConfigError, match="at cuda.model_path"):
        check_inputs(
            prepare(one_group(tiny_cuda(model_path="model")), base=REPO), cwd=tmp_path / "elsewhere"
        )


def test_schema_covers_every_cuda_key_the_run_code_reads():
    schema = load(REPO / "config" / "schema" / "config.schema.yaml")
    known = set(schema["properties"]["cuda"]["properties"])
    import re

    read = set()
    for f in (
        "workflow_scripts/wattflex/runs/options.py",
        "workflow_scripts/wattflex/runs/real_run.py",
        "workflow_scripts/wattflex/runs/training/train_config.py",
        "workflow_scripts/wattflex/runs/plan.py",
    ):
        read |= set(re.findall(r'cuda\.get\("([a-z_]+)"', (REPO / f).read_text()))
    assert read and read == known


SHIPPED = sorted(p for p in (REPO / "config").glob("*.yaml") if p.name != "models.yaml")


@pytest.mark.parametrize("path", SHIPPED + [TINY], ids=lambda p: p.name)
def test_every_shipped_config_still_validates(path):
    doc = load(path)
    prepare(merged(doc), base=REPO)  # as `snakemake --configfile` sees it
    if "groups" in doc or doc.get("source") == "ingest":
        prepare(copy.deepcopy(doc), base=REPO)  # on its own (wattflex commands)


def test_the_slurm_profiles_config_keys_validate():
    prepare(merged(load(REPO / "profiles" / "slurm" / "config.yaml")["config"]), base=REPO)


def test_defaulted_sections_names_what_the_users_file_left_out(tmp_path):
    user = tmp_path / "my.yaml"
    user.write_text(yaml.safe_dump({"campaign": "mine", "groups": [], "summary": {}}))
    cfg = merged(load(user))
    got = defaulted_sections(cfg, [user], {"slurm_gpus_per_node": 4})
    assert "allocation" in got and "control" in got
    assert not {"campaign", "groups", "summary", "slurm_gpus_per_node"} & set(got)
    assert (
        defaulted_sections({**merged(), "_catalog": {}}, [DEFAULT]) == []
    )  # the default config alone
    zeus = REPO / "config" / "zeus-nsdi23.yaml"
    got = defaulted_sections(merged(load(zeus)), [zeus])
    assert "allocation" in got and "groups" not in got and "backend" not in got


def test_the_docs_minimal_measured_campaign_validates(tmp_path):
    text = (REPO / "docs" / "measured.md").read_text()
    block = (
        text.split("A minimal measured campaign", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    )
    doc = yaml.safe_load(block)
    facts = load(REPO / "config" / "models.yaml")["models"]["Qwen3-32B"]
    d = model_dir(
        tmp_path,
        model_type=facts["hf_model_type"],
        num_hidden_layers=facts["layers"],
        hidden_size=facts["hidden"],
    )
    doc["cuda"]["model_path"] = str(d)
    check_inputs(prepare(merged(doc), base=REPO), cwd=tmp_path)


# google/gemma-4-26B-A4B's config.json (its shape: Gemma4ForConditionalGeneration, the text decoder's
# facts under text_config; the values the catalogue's: config/models.yaml)
GEMMA4_PUBLISHED = {
    "model_type": "gemma4",
    "architectures": ["Gemma4ForConditionalGeneration"],
    "text_config": {"model_type": "gemma4_text", "num_hidden_layers": 30, "hidden_size": 2816},
    "vision_config": {"model_type": "gemma4_vision", "num_hidden_layers": 27, "hidden_size": 1152},
}


def gemma4_campaign(tmp_path: Path, config_json: dict) -> dict:
    cfg = tiny_cuda(model_path=str(model_dir(tmp_path, **config_json)))
    cfg["groups"], cfg["repeats"] = (
        [{"id": "moe-pt-gemma4-x8", "model": "Gemma-4-26B-A4B", "task": "pt", "gpus": 8}],
        [],
    )
    return cfg


def test_a_published_multimodal_checkpoint_is_its_text_decoders_model(tmp_path):
    """The harness trains a multimodal checkpoint's text decoder (runs.training.models): the check
    compared the multimodal model_type ('gemma4') with the catalogue's ('gemma4_text') and refused
    the published Gemma-4; the decoder's facts are still checked."""
    check_inputs(
        prepare(gemma4_campaign(tmp_path / "a", GEMMA4_PUBLISHED), base=REPO), cwd=tmp_path
    )
    other = copy.deepcopy(GEMMA4_PUBLISHED)
    other["text_config"]["num_hidden_layers"] = 35  # another size of the family
    with pytest.raises(ConfigError, match="is not Gemma-4-26B-A4B .*num_hidden_layers 35"):
        check_inputs(prepare(gemma4_campaign(tmp_path / "b", other), base=REPO), cwd=tmp_path)
