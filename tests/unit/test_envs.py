"""envs/*.yaml (for --sdm conda) must list what pyproject.toml requires, with the same ranges."""

import re
import tomllib

import yaml

CONDA_NAMES = {
    "torch": "pytorch",
    "snakemake": "snakemake-minimal",
    "prometheus-client": "prometheus_client",
    "lazy-loader": "lazy_loader",
}


def _spec(req: str) -> tuple[str, str]:
    m = re.match(r"^([A-Za-z0-9_.-]+)\s*(.*)$", req.strip())
    return m.group(1).lower(), m.group(2).replace(" ", "")


def _conda(path):
    deps = yaml.safe_load(path.read_text())["dependencies"]
    out = {}
    for d in deps:
        if isinstance(d, str):
            name, rng = _spec(d)
            out[name] = rng
    return out


def test_envs_match_pyproject(repo):
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    core = dict(_spec(r) for r in project["dependencies"])
    train = dict(_spec(r) for r in project["optional-dependencies"]["train"])
    for env, required in (("analysis.yaml", core), ("train.yaml", {**core, **train})):
        conda = _conda(repo / "envs" / env)
        for name, rng in required.items():
            cname = CONDA_NAMES.get(name, name)
            assert cname in conda, f"envs/{env} lacks {cname} (pyproject: {name}{rng})"
            assert conda[cname] == rng, f"envs/{env}: {cname} {conda[cname]} != pyproject {rng}"


def test_every_rule_with_a_script_names_a_conda_env(repo):
    for smk in (repo / "rules").glob("*.smk"):
        text = smk.read_text()
        for block in re.split(r"\nrule ", text)[1:]:
            if "script:" in block:
                assert "conda:" in block, (
                    f"{smk.name}: rule {block.split(':')[0]} has no conda: directive"
                )
