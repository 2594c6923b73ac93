"""The receive path: reassemble, fetch, verify, order, acknowledge."""
