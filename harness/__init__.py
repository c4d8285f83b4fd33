"""Death tests for pytest: run a function in a child process and assert how it ended.

(Placeholder until the harness issue lands.)
"""
