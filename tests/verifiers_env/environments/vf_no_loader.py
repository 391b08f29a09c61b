"""A module that is no verifiers environment: it has no load_environment."""

ENVIRONMENT = "none"
