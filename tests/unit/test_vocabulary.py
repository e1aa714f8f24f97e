"""The workload vocabulary has one home (wattflex.vocabulary): the schema's enums list its
names, and the cluster rule is written once (config.groups and the ingest reader call it)."""

from wattflex.config import groups
from wattflex.schema import read_schema
from wattflex.vocabulary import CLUSTERS, SETS, TASKS, VOCABULARY, cluster_of


def enums(node, key, out=None):
    """Every ``enum`` the schema gives a property named ``key``, anywhere."""
    out = [] if out is None else out
    if isinstance(node, dict):
        for name, sub in node.items():
            if name == key and isinstance(sub, dict) and "enum" in sub:
                out.append(tuple(sub["enum"]))
            enums(sub, key, out)
    elif isinstance(node, list):
        for sub in node:
            enums(sub, key, out)
    return out


def test_the_schemas_enums_are_the_registrys_names():
    schema = read_schema()
    for key, names in VOCABULARY.items():
        found = enums(schema, key)
        assert found, key
        assert set(found) == {names}, (
            f"{key}: the schema lists {found}, wattflex.vocabulary {names}"
        )


def test_cluster_of_is_the_papers_rule():
    assert [cluster_of(a, t) for a in ("dense", "moe") for t in TASKS] == [
        "dense",
        "dense",
        "moe-pt",
        "moe-ft",
    ]
    assert cluster_of("ssm", "pt") is None and cluster_of("moe", "sft") is None
    assert set(CLUSTERS) == {cluster_of(a, t) for a in ("dense", "moe") for t in TASKS}


def test_the_default_campaign_derives_its_clusters_by_the_rule(default_config):
    for g in groups(default_config):
        assert g["cluster"] == cluster_of(g["architecture"], g["task"]) and g["set"] in SETS


def test_the_schemas_cluster_order_is_the_registrys():
    """stats.cluster_order (the default of `wattflex stats --order` too) lists the clusters in
    the registry's order, the paper's."""
    from wattflex.schema import section_defaults

    assert tuple(section_defaults("stats")["cluster_order"]) == CLUSTERS
