"""``--env verifiers:MODULE``: a verifiers environment trained unchanged (see ``README.md``)."""
