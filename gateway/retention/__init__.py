"""Retention by consumer group, one object per payload per account, quotas on what it keeps.

The state lives in the bucket and changes only through conditional writes
(`ObjectStore.write_versioned`), so every replica sees it and one that dies mid-way leaves a
state the others finish (docs/operations.md, "Retention by consumer group"):

* `_groups`: the operator's groups file (which topics wait for which consumer groups);
* `_records`, `_blobs`: a stored payload's record (the messages sharing it) and its changes;
* `_ledger`, `_accounts`: an account's ledger (stored bytes, holds of uploads in flight);
* `_keeper`: what deleting a message does to all of it, and the repairs after a crash;
* `_retention`: the request path's view (`Retention`: holds, adopt at commit, link,
  confirm, usage); `_sweeping`: the sweeper's passes; `_docs`: the conditional-write loop;
  `_metrics`: what it counts.

Other folders use only the names below.
"""

from ._accounts import LEDGER_PREFIX, Accounts, account_of, parse_ledger_key
from ._groups import GroupRules, Groups, parse_groups
from ._keeper import Keeper
from ._metrics import CONFIRMATIONS, DELETED, SWEEP_FAILED, SWEEP_OK, SWEEP_SUCCESS
from ._records import BLOBS_PREFIX, Record
from ._retention import Adoption, Confirmation, Hold, Retention, Usage
from ._sweeping import RetentionSweep, Tally

__all__ = [
    "BLOBS_PREFIX",
    "CONFIRMATIONS",
    "DELETED",
    "LEDGER_PREFIX",
    "SWEEP_FAILED",
    "SWEEP_OK",
    "SWEEP_SUCCESS",
    "Accounts",
    "Adoption",
    "Confirmation",
    "GroupRules",
    "Groups",
    "Hold",
    "Keeper",
    "Record",
    "Retention",
    "RetentionSweep",
    "Tally",
    "Usage",
    "account_of",
    "parse_groups",
    "parse_ledger_key",
]
