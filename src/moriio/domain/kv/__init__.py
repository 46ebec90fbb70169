"""KV geometry: cache layouts, the transfer planner, its plan cache and TP head mapping."""
