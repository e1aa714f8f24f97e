import copy
import re

import pytest
import yaml

from wattflex.config import ConfigError, expand_runs, groups, load_config, prepare
from wattflex.runs.campaign_checks import check_node_layouts


@pytest.fixture()
def raw(repo):
    return yaml.safe_load((repo / "config" / "config.yaml").read_text())


def _check(raw, repo):
    return prepare(copy.deepcopy(raw), base=repo)


def test_default_config_expands_the_paper_matrix(default_config):
    runs = expand_runs(default_config)
    gs = groups(default_config)
    assert sum(g["set"] == "headline" for g in gs) == 25
    assert sum(g["set"] == "validation" for g in gs) == 4
    assert sum(g["set"] == "h100" for g in gs) == 6
    # 16 six-cap + 8 four-cap + 1 three-cap headline groups, 24 validation runs, 34 H100 runs,
    # 21 extra repeats
    assert len(runs) == 16 * 6 + 8 * 4 + 3 + 24 + 34 + 21
    # Table 4's runs per cluster size: 120 on 8 GPUs (headline + validation), 19 on 16, 16 on 32
    first = [
        r
        for r in runs
        if r["repeat"] == 0 and next(g for g in gs if g["id"] == r["group"])["set"] != "h100"
    ]
    sizes = [next(g for g in gs if g["id"] == r["group"])["gpus"] for r in first]
    assert {n: sizes.count(n) for n in (8, 16, 32)} == {8: 120, 16: 19, 32: 16}
    clusters = {g["cluster"] for g in gs if g["set"] == "headline"}
    assert clusters == {"dense", "moe-pt", "moe-ft"}
    n_repeat_runs = sum(
        1
        for r in runs
        if (r["group"], r["cap_w"])
        in {(x["group"], float(x["cap_w"])) for x in default_config["repeats"]}
    )
    assert n_repeat_runs == 35


@pytest.mark.parametrize(
    "mutate,key,words",
    [
        (lambda c: c["groups"][0].update(model="GPT-99"), "groups[0].model", "unknown model"),
        (lambda c: c["groups"][1].update(caps=[100, 700]), "groups[1].caps", "outside the H200"),
        (lambda c: c["groups"][2].update(caps=[]), "groups[2].caps", "should be non-empty"),
        (
            lambda c: c["groups"][3].update(id=c["groups"][0]["id"]),
            "groups[3].id",
            "duplicate group id",
        ),
        (
            lambda c: c["groups"][0].update(id="bad id; rm -rf"),
            "groups[0].id",
            "unsafe in paths or shells",
        ),
        (lambda c: c["groups"][0].update(model="../etc/passwd"), "groups[0].model", "unsafe"),
        (lambda c: c.update(groups=[]), "groups", "should be non-empty"),
        (lambda c: c["groups"][0].update(task="rl"), "groups[0].task", "is not one of"),
        (
            lambda c: c["groups"][0].update(cap_grid="nine"),
            "groups[0].cap_grid",
            "unknown cap grid",
        ),
        (lambda c: c["groups"][0].update(cap_grid="four"), "groups[0]", "both caps and cap_grid"),
        (lambda c: c["groups"][0].update(colour="red"), "groups[0]", "unknown key"),
        (lambda c: c["repeats"][0].update(cap_w=450), "repeats[0].cap_w", "not in the caps"),
        (lambda c: c.update(backend="tpu"), "backend", "is not one of"),
    ],
)
def test_bad_config_stops_with_one_message_naming_the_key(raw, repo, mutate, key, words):
    mutate(raw)
    with pytest.raises(ConfigError) as err:
        _check(raw, repo)
    msg = str(err.value)
    assert f"at {key}" in msg and words in msg
    assert "\n" not in msg


def _moe_pt(c):
    return next(g for g in c["groups"] if g["id"].startswith("moe-pt-gptoss20b"))


# Semantic checks with bounds, the same for every backend.
@pytest.mark.parametrize("backend", ["emulated", "cuda"])
@pytest.mark.parametrize(
    "mutate,key,words",
    [
        (
            lambda c: _moe_pt(c).update(ep=3),
            "ep",
            "expert-parallel degree 3 does not divide gpus 8",
        ),
        (lambda c: c["groups"][0].update(ep=2), "groups[0].ep", "needs a mixture-of-experts model"),
        (
            lambda c: c["run"].update(eval_at_s=2000),
            "run.eval_at_s",
            "2000 s is not before the run ends",
        ),
        (
            lambda c: c["run"].update(checkpoint_at_s=1800),
            "run.checkpoint_at_s",
            "not before the run ends",
        ),
        (lambda c: c["run"].update(duration_s=10**12), "run.duration_s", "longer than a week"),
        (
            lambda c: c["run"].update(duration_s="1e12"),
            "run.duration_s",
            "write 1.0e+12 or 1000000000000",
        ),
        (
            lambda c: c["run"].update(sample_period_s=0.0001),
            "run.sample_period_s",
            "samples per GPU",
        ),
    ],
)
def test_run_and_group_bounds_name_the_key(raw, repo, mutate, key, words, backend):
    raw["backend"] = backend
    mutate(raw)
    with pytest.raises(ConfigError) as err:
        prepare(copy.deepcopy(raw), base=repo)
    msg = str(err.value)
    assert msg.startswith("config error at ") and key in msg and words in msg, msg
    assert "\n" not in msg


def test_ep_must_divide_the_experts(raw, repo):
    g = _moe_pt(raw)
    cfg = prepare(copy.deepcopy(raw), base=repo)
    from wattflex.config import check_expert_parallel

    with pytest.raises(ConfigError, match="does not divide the 32 experts of gpt-oss-20b"):
        check_expert_parallel({**g, "ep": 64, "gpus": 64}, cfg["_catalog"][g["model"]], "groups[1]")
    check_expert_parallel({**g, "ep": 8, "gpus": 16}, cfg["_catalog"][g["model"]], "groups[1]")


DUPLICATES = {
    "top level": ("campaign: a\nseed: 1\ncampaign: b\n", 3, "'campaign'", 1),
    "in a group": ("groups:\n  - {id: g, gpus: 8, gpus: 4}\n", 2, "'gpus'", 2),
}


@pytest.mark.parametrize("case", DUPLICATES, ids=list(DUPLICATES))
def test_a_key_given_twice_is_refused_naming_file_line_and_key(tmp_path, case):
    text, line, key, first = DUPLICATES[case]
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(p)
    assert str(err.value) == (
        f"{p}:{line}: key {key} given twice in one mapping (first at line {first}); "
        "YAML keeps only the last: delete one"
    )


def test_merge_keys_may_be_overridden(tmp_path):
    from wattflex.config import read_yaml

    p = tmp_path / "m.yaml"
    p.write_text("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  x: 3\n")
    assert read_yaml(p) == {"base": {"x": 1, "y": 2}, "other": {"x": 3, "y": 2}}


def test_a_utf16_config_is_refused_naming_the_encoding(tmp_path, repo):
    p = tmp_path / "c.yaml"
    p.write_bytes((repo / "tests" / "data" / "tiny.yaml").read_text().encode("utf-16"))
    with pytest.raises(ConfigError) as err:
        load_config(p)
    assert (
        str(err.value)
        == f"{p}: not UTF-8 text: UTF-16 (it starts with a UTF-16 byte-order mark); save it as UTF-8"
    )


def test_invalid_yaml_is_a_config_error(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("campaign: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)


# Configurations that pass the schema but would fail in a job after the runs (numpy's
# default_rng(-1), rng.choice with weights summing to 0 or of the wrong length, a run with no
# sample, the headline read from a cut never simulated): refused at validation, naming the key.
@pytest.mark.parametrize(
    "mutate,key,words",
    [
        (
            lambda c: c.setdefault("pfi", {}).update(seed=-1),
            "pfi.seed",
            "less than the minimum of 0",
        ),
        (
            lambda c: c["allocation"].update(seed=-1),
            "allocation.seed",
            "less than the minimum of 0",
        ),
        (
            lambda c: c["allocation"].update(sla={"tiers": [0.0, 0.1], "tier_weights": [0, 0]}),
            "allocation.sla.tier_weights",
            "all weights are 0",
        ),
        (
            lambda c: c["allocation"].update(sla={"tiers": [0.0, 0.1], "tier_weights": [1, 1, 1]}),
            "allocation.sla.tier_weights",
            "3 weights for 2 tiers",
        ),
        (
            lambda c: c["allocation"].update(headline={"cut": 0.33}),
            "allocation.headline.cut",
            "is not one of allocation.cuts",
        ),
        (
            lambda c: c["run"].update(
                duration_s=60, sample_period_s=100, eval_at_s=None, checkpoint_at_s=None
            ),
            "run.sample_period_s",
            "fewer than 2 samples in a run of 60 s",
        ),
    ],
)
def test_cross_field_rules_are_checked_at_validation_naming_the_key(raw, repo, mutate, key, words):
    mutate(raw)
    with pytest.raises(ConfigError) as err:
        prepare(copy.deepcopy(raw), base=repo)
    msg = str(err.value)
    assert msg.startswith(f"config error at {key}: ") and words in msg, msg


@pytest.mark.parametrize(
    "group",
    [
        # the longest start of the default groups' kind: 70B weights, torch.compile, slow steps at 200 W
        {"id": "ft70", "model": "Llama-3.1-70B", "task": "lora", "gpus": 8, "caps": [200, 700]},
        {"id": "moe", "model": "Qwen3-30B-A3B", "task": "pt", "gpus": 8, "ep": 8, "caps": [300]},
    ],
)
def test_an_emulated_run_too_short_to_train_is_refused_with_a_length_that_works(raw, repo, group):
    """Refused at validation, not after every run has run; and the length the message names is
    one the emulator meets: a run of that length at the slowest cap has a steady state."""
    from wattflex.config import run_spec
    from wattflex.runs.emulator.device import run_emulated
    from wattflex.runs.emulator.timeline import check_run_length
    from wattflex.telemetry import SummaryProtocol, summarize_run

    def check(raw):
        check_run_length(prepare(copy.deepcopy(raw), base=repo))

    raw.update(groups=[group], repeats=[])
    raw["run"].update(duration_s=120, eval_at_s=None, checkpoint_at_s=None)
    with pytest.raises(ConfigError) as err:
        check(raw)
    msg = str(err.value)
    assert msg.startswith("config error at run.duration_s: 120 s is too short for groups[0]")
    assert repr(group["id"]) in msg and "loads weights for" in msg, msg
    need_s = int(re.search(r"use at least (\d+) s", msg).group(1))

    raw["run"]["duration_s"] = need_s - 1
    with pytest.raises(ConfigError, match=f"use at least {need_s} s"):
        check(raw)
    raw["run"]["duration_s"] = need_s
    check(raw)
    cfg = prepare(copy.deepcopy(raw), base=repo)
    slowest = f"cap{min(group['caps'])}"
    telemetry, steps, _ = run_emulated(run_spec(cfg, group["id"], slowest))
    assert summarize_run(telemetry, steps, SummaryProtocol())["n_steps_training"] >= 1


def test_the_run_length_check_passes_over_what_runs_nothing_or_fails_on_its_own(raw, repo):
    """An ingested campaign (no groups) and a group whose catalogue entry is incomplete are not
    refused by the run-length check: the first runs nothing; the second's runs fail and record
    why while the other groups run (tests/workflow/test_run_scheduling.py)."""
    from wattflex.runs.emulator.timeline import check_run_length

    ingest = yaml.safe_load((repo / "config" / "zeus-nsdi23.yaml").read_text())
    check_run_length(prepare(copy.deepcopy(ingest), base=repo))

    cfg = prepare(copy.deepcopy(raw), base=repo)
    model = cfg["groups"][0]["model"]
    cfg["_catalog"][model] = {k: v for k, v in cfg["_catalog"][model].items() if k != "layers"}
    cfg["run"]["duration_s"] = 1.0  # too short for every complete group but the broken one's
    cfg["groups"] = cfg["groups"][:1]
    check_run_length(cfg)


@pytest.mark.parametrize("per_node,ok", [(None, 16), (4, 12), (8, 8)])
def test_a_measured_group_that_fills_no_whole_nodes_is_refused_at_start(raw, repo, per_node, ok):
    """12 GPUs on 8-GPU nodes (the schema's default node, or slurm_gpus_per_node) would be
    queued, then come up short on a node: refused before anything runs, naming what fits."""
    raw["backend"] = "cuda"
    if per_node:
        raw["slurm_gpus_per_node"] = per_node
        raw["cuda"] = {**raw.get("cuda", {}), "nproc_per_node": per_node}  # the harness's node
    raw["groups"][3]["gpus"] = 12 if per_node != 4 else 10
    with pytest.raises(ConfigError) as err:
        prepare(copy.deepcopy(raw), base=repo)
    msg = str(err.value)
    node = per_node or 8
    assert msg.startswith(
        f"config error at groups[3].gpus: group {raw['groups'][3]['id']} asks for"
    )
    assert f"not a whole number of {node}-GPU nodes" in msg and f"1-{node} on one node" in msg
    assert "\n" not in msg
    raw["groups"][3]["gpus"] = ok
    prepare(copy.deepcopy(raw), base=repo)
    raw["backend"] = "emulated"  # an emulated group runs no SLURM job
    raw["groups"][3]["gpus"] = 12
    prepare(copy.deepcopy(raw), base=repo)


def test_the_harness_layout_must_be_the_nodes_slurm_gives(raw, repo):
    """On 4-GPU nodes SLURM gives an 8-GPU group 2 nodes x 4; the harness's default 8 ranks per
    node would start 8 on one of them: refused at start, naming the setting that fits."""
    raw["backend"] = "cuda"
    raw["cuda"] = {**raw.get("cuda", {}), "device": "cuda"}
    raw["slurm_gpus_per_node"] = 4
    raw["groups"] = [g for g in raw["groups"] if g.get("gpus", 8) == 8][:1]
    raw["repeats"] = []
    with pytest.raises(ConfigError) as err:
        check_node_layouts(prepare(copy.deepcopy(raw), base=repo))
    msg = str(err.value)
    assert msg.startswith("config error at groups[0]: group ") and "\n" not in msg
    assert "2 node(s) x 4" in msg and "start 1 x 8 ranks" in msg
    assert msg.endswith("set cuda.nproc_per_node: 4")
    raw["cuda"]["nproc_per_node"] = 4
    check_node_layouts(prepare(copy.deepcopy(raw), base=repo))
