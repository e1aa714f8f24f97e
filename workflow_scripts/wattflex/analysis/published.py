"""The paper's published tables (resources/paper/tables) and side-by-side comparisons."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats


def load_published(tables_dir: str | Path, name: str) -> pd.DataFrame | None:
    """A published table by file stem (e.g. ``table6_pfi_h200``), or None if absent."""
    path = Path(tables_dir) / f"{name}.csv"
    return pd.read_csv(path) if path.is_file() else None


def table6_comparison(
    pfi: pd.DataFrame, published: pd.DataFrame | None, value_col: str = "pfi_ratio"
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Our per-group PFI beside Table 6 (and Table 7 validation rows if given) + summary stats."""
    ours = pfi[
        ["group", "cluster", "set", "n_caps", value_col, "ci95_low", "ci95_high", "status"]
    ].rename(columns={value_col: "pfi", "ci95_low": "ci95_low", "ci95_high": "ci95_high"})
    if published is None:
        table = ours.assign(
            pfi_published=np.nan,
            ci95_low_published=np.nan,
            ci95_high_published=np.nan,
            n_caps_published=np.nan,
        )
    else:
        pub = published.rename(
            columns={
                "pfi": "pfi_published",
                "ci95_low": "ci95_low_published",
                "ci95_high": "ci95_high_published",
                "n_caps": "n_caps_published",
            }
        )
        keep = [
            c
            for c in (
                "group",
                "pfi_published",
                "ci95_low_published",
                "ci95_high_published",
                "n_caps_published",
            )
            if c in pub
        ]
        table = ours.merge(pub[keep], on="group", how="left")
    table["delta"] = table["pfi"] - table["pfi_published"]
    head = table[table["set"] == "headline"]
    both = head[np.isfinite(head["pfi"]) & np.isfinite(head["pfi_published"])]
    summary: dict[str, Any] = {"n_groups": int(len(head)), "n_compared": int(len(both))}
    if len(both) >= 3:
        rho, p = stats.spearmanr(both["pfi"], both["pfi_published"])
        summary.update(spearman_rho=float(rho), spearman_p=float(p))
    for cl, sub in head.groupby("cluster"):
        summary[f"median_{cl}"] = float(np.nanmedian(sub["pfi"]))
        summary[f"median_{cl}_published"] = float(np.nanmedian(sub["pfi_published"]))
    summary["range"] = (
        [float(np.nanmin(head["pfi"])), float(np.nanmax(head["pfi"]))] if len(head) else []
    )
    return table, summary
