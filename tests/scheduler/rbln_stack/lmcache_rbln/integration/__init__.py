"""Stand-in package (tests/scheduler/rbln_stack/README.md)."""
