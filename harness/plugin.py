"""pytest glue for the death-test harness (placeholder until the harness issue lands)."""
