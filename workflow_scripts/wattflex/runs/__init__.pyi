# The names `wattflex.runs` hands on, loaded on first use (lazy_loader reads this stub).
from .failures import (
    MISSING_COLUMNS,
    annotate_missing,
    expected_uncapped,
    failed_summary,
    failure_summary,
    is_failed,
    record_failed_run,
    split_failed,
    unsummarised_summary,
)
from .plan import plan_campaign, plan_groups
from .runner import run_at_cap
from .spec import RunSpec

__all__ = [
    "MISSING_COLUMNS",
    "RunSpec",
    "annotate_missing",
    "expected_uncapped",
    "failed_summary",
    "failure_summary",
    "is_failed",
    "plan_campaign",
    "plan_groups",
    "record_failed_run",
    "run_at_cap",
    "split_failed",
    "unsummarised_summary",
]
