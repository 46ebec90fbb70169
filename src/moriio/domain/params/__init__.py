"""A request's ``kv_transfer_params``, from routers and to them, parsed and validated once, and
the per-step orders the scheduler sends its workers."""
