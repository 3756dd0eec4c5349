"""The ``dagster-gpu`` commands: argument parsing, loading the user's definitions, reading the instance, printing."""
