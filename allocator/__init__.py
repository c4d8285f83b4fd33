"""A compact device allocator (placeholder until the allocator issue lands)."""
