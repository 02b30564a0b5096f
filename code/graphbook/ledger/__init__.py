"""The claims ledger: each takeaway a chapter states, as a named predicate over the recorded runs."""
