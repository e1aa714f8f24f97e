"""A sweep table with every case the PFI code branches on, for test_pfi_vectorised.py:
3-6 caps, 2 % noise (many non-monotone groups), repeats, equal powers (ties), invalid rows,
a group below its uncapped cap, SEMs missing at a cap or everywhere, T == T_max exactly,
capped points faster or at more power than the uncapped one, one-cap and empty groups."""

import numpy as np
import pandas as pd


def mixed_table(n_groups: int = 160, seed: int = 11) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    parts = []
    for g in range(n_groups):
        caps = np.array([200.0, 300.0, 400.0, 500.0, 600.0, 700.0])[
            np.sort(rng.choice(6, 3 + g % 4, replace=False))
        ]
        caps[-1] = 700.0 if g % 9 else caps[-1]
        k = rng.uniform(0.2, 1.0)
        t = 100 * (1 - k * (1 - caps / 700) ** 1.5) * rng.normal(1, 0.02, caps.size)
        p = 8 * caps * rng.uniform(0.85, 0.99, caps.size)
        d = pd.DataFrame(
            {
                "group": f"m/{g}",
                "cap_w": caps,
                "power_w": p,
                "throughput": t,
                "power_w_sem": rng.uniform(1, 8, caps.size),
                "throughput_sem": rng.uniform(0.1, 1.5, caps.size),
                "gpus": 8,
                "expect": 700.0,
            }
        )
        kind = g % 13
        if kind == 1:  # a repeat at the lowest cap
            d = pd.concat([d, d.iloc[[0]].assign(throughput=d.throughput.iloc[0] * 1.01)])
        elif kind == 2:  # two caps at the same power
            d.loc[d.index[1], "power_w"] = d.power_w.iloc[0]
        elif kind == 3:  # an invalid row
            d.loc[d.index[0], "throughput"] = -1.0
        elif kind == 4:  # the uncapped row invalid
            d.loc[d.index[-1], "power_w"] = np.nan
        elif kind == 5:  # SEM missing at a cap
            d.loc[d.index[1], "throughput_sem"] = np.nan
        elif kind == 6:  # T == T_max exactly
            d.loc[d.index[0], "throughput"] = d.throughput.iloc[-1]
        elif kind == 7:  # a capped run faster, at more power
            d.loc[d.index[-2], ["throughput", "power_w"]] = [
                d.throughput.iloc[-1] * 1.05,
                d.power_w.iloc[-1] * 1.01,
            ]
        elif kind == 8:  # one cap left
            d = d.iloc[[0]]
        elif kind == 9:  # no SEMs
            d[["power_w_sem", "throughput_sem"]] = np.nan
        elif kind == 10:  # flat: no loss
            d["throughput"] = 100.0 * rng.normal(1, 0.001, len(d))
        parts.append(d)
    return pd.concat(parts, ignore_index=True)


KWARGS = dict(
    power_sem_col="power_w_sem", throughput_sem_col="throughput_sem", uncapped_cap_w="expect"
)
