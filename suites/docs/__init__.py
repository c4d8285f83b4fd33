"""The docs are tests: every copyable block of README.md and docs/ runs as written."""
