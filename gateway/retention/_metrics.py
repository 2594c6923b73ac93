"""Retention's Prometheus metrics: label sets bounded by the code, never by accounts or
topics (docs/operations.md, "Retention by consumer group")."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

QUOTA_REFUSALS = Counter(
    "offload_quota_refusals_total",
    "Uploads refused because their account would pass OFFLOAD_MAX_STORED_BYTES_PER_USER",
)
DEDUP = Counter(
    "offload_dedup_links_total",
    "Messages linked to a payload their account already stored (`link`: no bytes sent; "
    "`commit`: the bytes just received were dropped)",
    ["when"],
)
CONFIRMATIONS = Counter(
    "offload_confirmations_total",
    "Group confirmations received (`new`: recorded; `again`: the group had confirmed; "
    "`ignored`: not a group of the message)",
    ["outcome"],
)
DELETED = Counter(
    "offload_retention_deleted_total",
    "Messages deleted by the gateway, by why (`confirmed`: every group confirmed; "
    "`expired`: its expiry passed)",
    ["reason"],
)
SWEEP_RUNS = Counter(
    "offload_sweeper_runs_total",
    "Full retention sweeps by result (`ok`; `failed`: the store could not be listed or an "
    "object could not be handled)",
    ["result"],
)
SWEEP_OK, SWEEP_FAILED = SWEEP_RUNS.labels("ok"), SWEEP_RUNS.labels("failed")  # from the start
SWEEP_SUCCESS = Gauge(
    "offload_sweeper_last_success_timestamp_seconds",
    "Unix time the last full sweep of this gateway ended without a failure (0: none yet)",
    multiprocess_mode="max",  # offload-gateway --workers N: the latest of any worker's
)
STORED_BYTES = Gauge(
    "offload_stored_bytes",
    "Payload bytes every account stores, each shared payload once (the ledgers, as the "
    "last sweep read them; 0 without OFFLOAD_MAX_STORED_BYTES_PER_USER)",
)
ACCOUNTS = Gauge(
    "offload_accounts",
    "Accounts by the share of OFFLOAD_MAX_STORED_BYTES_PER_USER they use (as the last "
    "sweep read them): `under_50`, `50_to_80`, `80_to_100`, `full`",
    ["usage"],
)
TOP_ACCOUNTS = Gauge(
    "offload_account_stored_bytes",
    "Stored bytes of the accounts that store the most (at most OFFLOAD_TOP_ACCOUNTS of "
    "them, renewed each sweep; the rest are not named)",
    ["account"],
)
