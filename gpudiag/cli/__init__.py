"""The command line: one module per command group, the shared app, help text and option coercion."""
